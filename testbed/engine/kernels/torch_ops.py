"""The reference implementation in plain torch ops (any device)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from testbed.engine.attention.kv_pool import store_kv
from testbed.engine.kernels import KERNELS
from testbed.engine.kernels.base import Ops

__all__ = ["TorchOps", "apply_rotary"]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]: rotate the pairs (x[i], x[i + D/2]) by position angles, in float32."""
    dtype = x.dtype
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype)


@KERNELS.register("torch")
class TorchOps(Ops):
    name = "torch"

    def rmsnorm(self, x, weight, eps):
        dtype = x.dtype
        # torch's rms_norm is one fused kernel on CUDA
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(dtype)

    def add_rmsnorm(self, x, residual, weight, eps):
        s = x + residual
        return self.rmsnorm(s, weight, eps), s

    def qkv_rope_store(self, qkv, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps, k_cache, v_cache, loc, q_out=None):
        T = qkv.shape[0]
        D = k_cache.shape[-1]
        q, k, v = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
        q, k, v = q.view(T, num_heads, D), k.view(T, num_kv_heads, D), v.view(T, num_kv_heads, D)
        if q_norm is not None:
            q, k = self.rmsnorm(q, q_norm, eps), self.rmsnorm(k, k_norm, eps)
        # one rotary over q and k heads together: half the kernels of two
        qk = apply_rotary(torch.cat((q, k), dim=1), cos, sin)
        store_kv(k_cache, v_cache, loc, qk[:, num_heads:], v)
        return qk[:, :num_heads] if q_out is None else q_out.copy_(qk[:, :num_heads])

    def silu_mul(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
