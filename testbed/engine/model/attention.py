"""Self-attention block: fused qkv projection; q/k RMSNorm (Qwen3), RoPE and the K/V store
into the paged pool in one op; paged attention through the backend; output projection.
``project`` and ``output`` are the parts before and after the attention call (what the
piecewise CUDA graphs capture, testbed/engine/piecewise_graphs.py)."""

from __future__ import annotations

import torch
import torch.nn as nn

from testbed.engine.attention.base import AttentionBackend
from testbed.engine.forward_batch import ForwardBatch
from testbed.engine.kernels.base import Ops
from testbed.engine.model.norm import RMSNorm
from testbed.engine.model.parallel import QKVParallelLinear, RowParallelLinear, TensorParallel
from testbed.modelspec import ModelSpec

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelSpec, layer_id: int, tp: TensorParallel, ops: Ops, dtype, device) -> None:
        super().__init__()
        self.layer_id, self.ops = layer_id, ops
        self.head_dim = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads, cfg.attention_bias, tp, dtype, device
        )
        self.num_heads = self.qkv_proj.heads_local
        self.num_kv_heads = self.qkv_proj.kv_heads_local
        self.o_proj = RowParallelLinear(
            cfg.q_dim, cfg.hidden_size, cfg.o_bias, tp, dtype, device
        )
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, ops, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, ops, dtype, device)
        else:
            self.q_norm = self.k_norm = None

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], pool, loc: torch.Tensor,
                q_out: torch.Tensor | None = None) -> torch.Tensor:
        """Before attention: qkv projection, q/k norm + RoPE, K/V stored at ``loc``; returns q
        [T, heads, D] (written into ``q_out`` when given)."""
        cos, sin = rope
        norms = (self.q_norm.weight, self.k_norm.weight) if self.q_norm is not None else (None, None)
        return self.ops.qkv_rope_store(self.qkv_proj(x), cos, sin, self.num_heads, self.num_kv_heads, *norms,
                                       self.eps, pool.k[self.layer_id], pool.v[self.layer_id], loc, q_out)

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """After attention: the output projection of o [T, heads, D]."""
        return self.o_proj(o.reshape(o.shape[0], self.num_heads * self.head_dim))

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        fb: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        q = self.project(x, rope, backend.pool, fb.out_cache_loc)
        return self.output(backend.attend(self.layer_id, q, fb))
