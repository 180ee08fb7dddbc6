"""The paged KV cache memory: one K and one V buffer per layer, indexed by raw token slot."""

from __future__ import annotations

import torch

__all__ = ["KVPool", "store_kv"]


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """Store new tokens' K/V ([T, kv_heads, head_dim]) into slots ``loc`` ([T]) of one layer's buffers."""
    loc = loc.long()
    k_cache[loc] = k.to(k_cache.dtype)
    v_cache[loc] = v.to(v_cache.dtype)


class KVPool:
    """K/V buffers per layer shaped [num_slots, num_kv_heads, head_dim] (NHD).

    Slot ``s`` is offset ``s % page_size`` of page ``s // page_size``; :meth:`paged` gives the
    same memory as [num_pages, page_size, heads, dim] for paged kernels. Under tensor
    parallelism ``num_kv_heads`` is the number of heads this rank holds.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        page_size: int = 1,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < 1 or num_slots % page_size:
            raise ValueError(
                f"num_slots must be a positive multiple of page_size ({page_size}), got {num_slots}"
            )
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.page_size = page_size
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]

    @property
    def num_pages(self) -> int:
        return self.num_slots // self.page_size

    @property
    def nbytes(self) -> int:
        """Bytes the K and V buffers hold (sizing is ModelSpec.kv_bytes_per_token's job)."""
        return sum(t.nbytes for t in self.k + self.v)

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V ([T, kv_heads, head_dim]) into slots ``loc`` ([T])."""
        store_kv(self.k[layer], self.v[layer], loc, k, v)

    def paged(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) of a layer as [num_pages, page_size, kv_heads, head_dim] views (NHD)."""
        shape = (self.num_pages, self.page_size, self.num_kv_heads, self.head_dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def __repr__(self) -> str:
        return (
            f"KVPool(layers={self.num_layers}, slots={self.num_slots}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dtype={self.dtype}, page_size={self.page_size}, "
            f"{self.nbytes / 2**20:.1f} MiB on {self.device})"
        )
