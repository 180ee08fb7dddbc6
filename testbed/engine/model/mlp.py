"""SiLU-gated MLP: down(silu(gate(x)) * up(x)), gate and up fused in one column-parallel matmul."""

from __future__ import annotations

import torch
import torch.nn as nn

from testbed.engine.kernels.base import Ops
from testbed.engine.model.parallel import MergedColumnParallelLinear, RowParallelLinear, TensorParallel

__all__ = ["GatedMLP"]


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, tp: TensorParallel, ops: Ops, dtype, device):
        super().__init__()
        self.ops = ops
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate, intermediate], bias, tp, dtype, device
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, tp, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_mul(self.gate_up_proj(x)))
