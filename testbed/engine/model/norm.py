"""RMSNorm (computed in float32, as the HF reference does), by the model's ops."""

from __future__ import annotations

import torch
import torch.nn as nn

from testbed.engine.kernels.base import Ops

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: Ops, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.eps, self.ops = eps, ops
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rmsnorm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm."""
        return self.ops.add_rmsnorm(x, residual, self.weight, self.eps)

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": tuple(self.weight.shape)}

    def load(self, shard_id: str, reader) -> None:
        self.weight.data.copy_(reader.read())
