"""What the model layers ask of an elementwise-ops implementation."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

__all__ = ["Ops"]


class Ops(ABC):
    name = "?"

    @abstractmethod
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * norm(x) over the last dim, computed in float32 and rounded to x's dtype
        before the weight (as HF Llama/Qwen do)."""

    @abstractmethod
    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """s = x + residual (in x's dtype); returns (rmsnorm(s), s)."""

    @abstractmethod
    def qkv_rope_store(
        self,
        qkv: torch.Tensor,  # [T, (H + 2 KV) * D]: q | k | v of the new tokens
        cos: torch.Tensor,  # float32 [T, D / 2]
        sin: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        q_norm: torch.Tensor | None,  # [D] per-head RMSNorm weights (Qwen3), or None
        k_norm: torch.Tensor | None,
        eps: float,
        k_cache: torch.Tensor,  # [slots, KV, D]
        v_cache: torch.Tensor,
        loc: torch.Tensor,  # int32 [T]: the new tokens' slots
        q_out: torch.Tensor | None = None,  # [T, H, D] to write q into (a graph's fixed buffer)
    ) -> torch.Tensor:
        """Optional q/k RMSNorm, rotate-half RoPE on q and k, store k and v at ``loc``;
        returns q [T, H, D] (``q_out`` when given)."""

    @abstractmethod
    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2 I] (gate | up) -> silu(gate) * up, [T, I]."""
