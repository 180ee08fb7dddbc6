"""Self-attention block: fused qkv projection, optional per-head q/k RMSNorm (Qwen3), RoPE,
paged attention through the backend, output projection."""

from __future__ import annotations

import torch
import torch.nn as nn

from testbed.engine.attention.base import AttentionBackend
from testbed.engine.forward_batch import ForwardBatch
from testbed.engine.model.config import ModelConfig
from testbed.engine.model.norm import RMSNorm
from testbed.engine.model.parallel import QKVParallelLinear, RowParallelLinear, TensorParallel
from testbed.engine.model.rotary import apply_rotary

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TensorParallel, dtype, device) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias, tp, dtype, device
        )
        self.num_heads = self.qkv_proj.heads_local
        self.num_kv_heads = self.qkv_proj.kv_heads_local
        self.o_proj = RowParallelLinear(
            cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.o_bias, tp, dtype, device
        )
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        fb: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        # one rotary over q and k heads together: half the kernels of two
        qk = apply_rotary(torch.cat((q, k), dim=1), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads:]
        o = backend.forward(self.layer_id, q, k, v, fb)
        return self.o_proj(o.reshape(T, self.num_heads * self.head_dim))
