from dataclasses import dataclass
from typing import ClassVar

from policies.base import PolicyConfig
from policies.scheduling.decode_first import DecodeFirst


@dataclass
class ChunkedConfig(PolicyConfig):
    name: str = "chunked"
    token_budget: int = 512  # a step's tokens, decodes included: small, so that no step stalls the decodes
    step_budget_key: ClassVar[str] = "token_budget"


class Chunked(DecodeFirst):
    """Sarathi-Serve stall-free batching: the same order as decode_first (decodes, then
    prefill chunks under way, then new prefills in chunks) under a small fixed per-step
    token budget (token_budget, default 512), so that no step stalls the decodes."""
    name = "chunked"
    Config = ChunkedConfig
