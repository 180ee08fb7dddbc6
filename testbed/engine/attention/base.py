"""What the model's attention layers need from an attention backend."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from testbed.engine.attention.kv_pool import KVPool
from testbed.engine.forward_batch import ForwardBatch

__all__ = ["AttentionBackend"]


class AttentionBackend(ABC):
    """Paged attention over a :class:`KVPool`, one instance shared by all layers of a model.

    Per step the model calls :meth:`prepare` once with the batch (plan kernels, build
    per-request metadata), then each layer stores the new tokens' K/V into the pool at
    ``fb.out_cache_loc`` (the model's ops fuse that into RoPE) and calls :meth:`attend`,
    which attends each new token to its request's context (cached prefix + new tokens,
    causal). :meth:`forward` is both, for callers holding k and v.

    Head counts are those of this tensor-parallel rank.
    """

    name: str = "?"

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        sm_scale: float | None = None,
    ) -> None:
        if num_qo_heads % num_kv_heads:
            raise ValueError(
                f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        self.kv_pool: KVPool | None = None

    def attach_kv_pool(self, pool: KVPool) -> None:
        if pool.num_kv_heads != self.num_kv_heads or pool.head_dim != self.head_dim:
            raise ValueError(
                f"KV pool has {pool.num_kv_heads} kv heads x {pool.head_dim}, the attention "
                f"backend wants {self.num_kv_heads} x {self.head_dim}"
            )
        self.kv_pool = pool

    @property
    def pool(self) -> KVPool:
        if self.kv_pool is None:
            raise RuntimeError(
                f"attention backend {self.name!r} has no KV pool: call model.attach_kv_pool(...) "
                "or model.create_kv_pool(...) before running a batch"
            )
        return self.kv_pool

    @abstractmethod
    def prepare(self, fb: ForwardBatch) -> None:
        """Per-step setup, once before the layers run."""

    @abstractmethod
    def attend(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, qo_heads, D] of the new tokens, whose K/V are already in the pool ->
        output [T, qo_heads, D] (written into ``out`` when given)."""

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """Store k/v [T, kv_heads, D] of the new tokens, then :meth:`attend`."""
        self.pool.write(layer_id, fb.out_cache_loc, k, v)
        return self.attend(layer_id, q, fb)
