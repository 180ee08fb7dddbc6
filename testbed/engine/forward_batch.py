"""The one structure the scheduler hands the model each step.

Token-slot convention (page size 1 "raw slots"): every KV position of every request lives
in one slot of the KV pool. The scheduler owns the page table; the model only reads it:

- request ``i``'s new tokens are ``input_ids[qo_indptr[i]:qo_indptr[i+1]]`` at absolute
  ``positions`` (the first one equals the number of tokens it already has cached);
- its whole context (cached prefix + the new tokens) lives in the slots
  ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``, position ``p`` in ``kv_indices[kv_indptr[i] + p]``;
- the new tokens' K/V are written to ``out_cache_loc`` (the tail of the request's slots).

Slots are grouped in pages of ``page_size`` consecutive slots (``slot = page * page_size +
offset``, a request's position ``p`` at offset ``p % page_size``); kernels that want page ids
get them from :func:`paged_kv_layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ForwardBatch", "paged_kv_layout"]


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    qo_indptr: torch.Tensor  # int32 [B+1]
    kv_indptr: torch.Tensor  # int32 [B+1]
    kv_indices: torch.Tensor  # int32 [sum ctx]
    out_cache_loc: torch.Tensor  # int32 [T]
    is_decode: bool
    page_size: int = 1
    # Optional host copies of the indptrs: kernels plan on the host, and with these at hand
    # they need no device->host sync. ``to(device)`` fills them from a host-built batch.
    qo_indptr_cpu: torch.Tensor | None = None
    kv_indptr_cpu: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.qo_indptr.numel()) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def extend_lens(self) -> torch.Tensor:
        """New tokens per request, int64 [B]."""
        return (self.qo_indptr[1:] - self.qo_indptr[:-1]).long()

    def last_token_index(self) -> torch.Tensor:
        """Row of each request's last new token in the flat token dimension, int64 [B]."""
        return self.qo_indptr[1:].long() - 1

    def host_qo_indptr(self) -> torch.Tensor:
        return self.qo_indptr_cpu if self.qo_indptr_cpu is not None else self.qo_indptr.cpu()

    def host_kv_indptr(self) -> torch.Tensor:
        return self.kv_indptr_cpu if self.kv_indptr_cpu is not None else self.kv_indptr.cpu()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "ForwardBatch":
        """The batch on ``device``; host copies of the indptrs are kept for planning."""

        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        def host(t: torch.Tensor, cached: torch.Tensor | None) -> torch.Tensor | None:
            return cached if cached is not None else (t if t.device.type == "cpu" else None)

        return ForwardBatch(
            input_ids=mv(self.input_ids),
            positions=mv(self.positions),
            qo_indptr=mv(self.qo_indptr),
            kv_indptr=mv(self.kv_indptr),
            kv_indices=mv(self.kv_indices),
            out_cache_loc=mv(self.out_cache_loc),
            is_decode=self.is_decode,
            page_size=self.page_size,
            qo_indptr_cpu=host(self.qo_indptr, self.qo_indptr_cpu),
            kv_indptr_cpu=host(self.kv_indptr, self.kv_indptr_cpu),
        )

    def validate(self) -> None:
        """Check the invariants (host syncs: for tests and debugging, not the hot path)."""
        T, B = self.num_tokens, self.batch_size
        if B < 1:
            raise ValueError("ForwardBatch has no requests (qo_indptr needs B+1 >= 2 entries)")
        if self.kv_indptr.numel() != B + 1:
            raise ValueError(f"kv_indptr has {self.kv_indptr.numel()} entries, expected {B + 1}")
        for name in ("positions", "out_cache_loc"):
            n = getattr(self, name).numel()
            if n != T:
                raise ValueError(f"{name} has {n} entries, expected {T} (one per new token)")
        qo = self.qo_indptr.tolist()
        kv = self.kv_indptr.tolist()
        if qo[0] != 0 or qo[-1] != T:
            raise ValueError(f"qo_indptr must run from 0 to {T}, got {qo[0]}..{qo[-1]}")
        if kv[0] != 0 or kv[-1] != self.kv_indices.numel():
            raise ValueError("kv_indptr must run from 0 to len(kv_indices)")
        pos = self.positions.tolist()
        loc = self.out_cache_loc.tolist()
        idx = self.kv_indices.tolist()
        for i in range(B):
            n, ctx = qo[i + 1] - qo[i], kv[i + 1] - kv[i]
            if n < 1 or n > ctx:
                raise ValueError(f"request {i}: {n} new tokens with context {ctx}")
            if self.is_decode and n != 1:
                raise ValueError(f"is_decode batch but request {i} extends by {n} tokens")
            want_pos = list(range(ctx - n, ctx))
            if pos[qo[i] : qo[i + 1]] != want_pos:
                raise ValueError(f"request {i}: positions {pos[qo[i]:qo[i + 1]]} != {want_pos}")
            if loc[qo[i] : qo[i + 1]] != idx[kv[i + 1] - n : kv[i + 1]]:
                raise ValueError(f"request {i}: out_cache_loc is not the tail of its kv_indices")
            if self.page_size > 1:
                for p, slot in enumerate(idx[kv[i] : kv[i + 1]]):
                    if slot % self.page_size != p % self.page_size:
                        raise ValueError(
                            f"request {i}: position {p} in slot {slot} breaks the page layout "
                            f"(page_size {self.page_size} wants offset {p % self.page_size})"
                        )
                    if p % self.page_size and slot != idx[kv[i] + p - 1] + 1:
                        raise ValueError(f"request {i}: page of position {p} is not contiguous")


def paged_kv_layout(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw-slot page table -> (page_indptr int32 [B+1], page_ids int32 [P], last_page_len int32 [B]).

    Request i holds ceil(ctx_i / page_size) pages; page j's id is the slot of position
    j * page_size divided by page_size; the last page holds ctx_i - (pages_i - 1) * page_size
    entries. page_indptr and last_page_len live where ``kv_indptr`` lives (pass it on the
    host to keep the device stream free of syncs), page_ids where ``kv_indices`` lives.
    """
    indptr = kv_indptr.long()
    ctx = indptr[1:] - indptr[:-1]
    if page_size == 1:
        return indptr.int(), kv_indices.int(), torch.ones_like(ctx, dtype=torch.int32)
    num_pages = (ctx + page_size - 1) // page_size
    page_indptr = torch.zeros_like(indptr)
    page_indptr[1:] = torch.cumsum(num_pages, 0)
    req = torch.repeat_interleave(torch.arange(ctx.numel(), device=ctx.device), num_pages)
    page_in_req = torch.arange(req.numel(), device=ctx.device) - page_indptr[req]
    first_pos = (indptr[req] + page_in_req * page_size).to(kv_indices.device)
    page_ids = torch.div(kv_indices.long()[first_pos], page_size, rounding_mode="floor")
    last_page_len = ctx - (num_pages - 1) * page_size
    return page_indptr.int(), page_ids.int(), last_page_len.int()
