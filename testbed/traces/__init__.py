"""Trace loaders: turn a trace file (or a synthetic recipe) into a list of requests with
arrival times, prompt token ids and output lengths.

    from testbed.traces import load_trace
    trace = load_trace(cfg)   # cfg: any object with TraceConfig's fields (or a mapping)

Light: numpy and pandas only. Every problem raises TraceError (a ValueError) with a
one-line message naming the file, row and column.
"""
from __future__ import annotations

from typing import Any

from . import azure, csv_length, mooncake, synthetic, user_file
from .base import TRACE_DIR, Trace, TraceError, TraceRequest
from .config import OVER_CONTEXT_RULES, TraceConfig, resolve_config

_LOADERS = {
    **{name: csv_length.load for name in csv_length.FILES},
    **{name: azure.load for name in azure.FILES},
    **{name: mooncake.load for name in mooncake.FILES},
    "synthetic": synthetic.load,
    "file": user_file.load,
}
TRACE_NAMES: tuple[str, ...] = (
    "sharegpt", "azure_conv", "azure_code", "arxiv", "bwb",
    "mooncake_conversation", "mooncake_synthetic", "synthetic", "file",
)
assert set(TRACE_NAMES) == set(_LOADERS)


def load_trace(cfg: Any = None, **overrides: Any) -> Trace:
    """Load the trace `cfg.name` (see TraceConfig for the fields and their defaults).
    Keyword overrides win over cfg, e.g. load_trace(cfg, num_requests=200)."""
    if overrides:
        base = resolve_config(cfg, TRACE_NAMES) if cfg is not None else TraceConfig()
        merged = {f: getattr(base, f) for f in TraceConfig.__dataclass_fields__}
        merged.update(overrides)
        cfg = merged
    k = resolve_config(cfg, TRACE_NAMES)
    return _LOADERS[k.name](k)


__all__ = [
    "load_trace", "TRACE_NAMES", "TRACE_DIR", "Trace", "TraceRequest", "TraceError",
    "TraceConfig", "OVER_CONTEXT_RULES",
]
