"""Host arrays -> device tensors through pinned staging buffers.

A step's batch is a dozen small integer arrays built on the host. Copied one by one from
pageable memory, each copy is a staged, partly synchronous transfer (~50-100 us of CPU each,
more for a large page table). Here they are packed into one pinned buffer per dtype and
sent with one asynchronous copy each, into a device buffer the step then reads views of.

Buffers are used in turn (``slots`` of them); a slot is reused only after the event given to
:meth:`release` for its last use -- recorded after everything the step enqueued -- has passed,
so neither a copy still in flight nor a kernel still reading is overwritten.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

__all__ = ["PinnedUploader"]


class PinnedUploader:
    def __init__(self, device: torch.device | str, slots: int = 3) -> None:
        # on the CPU (tests) the same packing runs with plain host buffers and no events
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._buffers: list[dict] = [{} for _ in range(slots)]  # per slot: numpy dtype -> (pinned, device)
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._turn = 0  # the slot the next upload takes

    def _buffer(self, slot: int, dtype: np.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        have = self._buffers[slot].get(dtype)
        if have is None or have[0].numel() < n:
            cap = max(n, 2 * (have[0].numel() if have is not None else 1024))
            tdt = torch.from_numpy(np.zeros(0, dtype)).dtype
            have = (torch.empty(cap, dtype=tdt, pin_memory=self.cuda), torch.empty(cap, dtype=tdt, device=self.device))
            self._buffers[slot][dtype] = have
        return have

    def upload(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Device tensors with the arrays' contents, shapes and dtypes (one copy per dtype)."""
        slot = self._turn
        self._turn = (slot + 1) % len(self._buffers)
        if self._events[slot] is not None:
            self._events[slot].synchronize()
        groups: dict[np.dtype, list[int]] = defaultdict(list)
        for i, a in enumerate(arrays):
            groups[np.dtype(a.dtype)].append(i)
        out: list[torch.Tensor | None] = [None] * len(arrays)
        for dtype, idx in groups.items():
            sizes = [arrays[i].size for i in idx]
            total = sum(sizes)
            host, dev = self._buffer(slot, dtype, total)
            h = host.numpy()
            off = 0
            for i, k in zip(idx, sizes):
                h[off:off + k] = arrays[i].ravel()
                out[i] = dev[off:off + k].view(arrays[i].shape)
                off += k
            if total:
                dev[:total].copy_(host[:total], non_blocking=self.cuda)
        return out  # type: ignore[return-value]

    def release(self, event: "torch.cuda.Event") -> None:
        """Mark the end of what reads the last upload's buffers: ``event``, recorded after
        everything the step enqueued."""
        if self.cuda:
            self._events[(self._turn - 1) % len(self._events)] = event  # the last upload's slot
