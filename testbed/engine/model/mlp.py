"""SiLU-gated MLP: down(silu(gate(x)) * up(x)), gate and up fused in one column-parallel matmul."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from testbed.engine.model.parallel import MergedColumnParallelLinear, RowParallelLinear, TensorParallel

__all__ = ["GatedMLP"]


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, tp: TensorParallel, dtype, device):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate, intermediate], bias, tp, dtype, device
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, tp, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
