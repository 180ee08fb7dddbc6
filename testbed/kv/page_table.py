"""Page table: (request slot, position) -> raw KV slot, one row per running request."""
from __future__ import annotations

import mmap

import numpy as np


def lazy_zeros(shape: tuple[int, int], dtype) -> np.ndarray:
    """Zeros the OS backs only where written, 4 KiB at a time. numpy's own zeros are lazy too,
    but numpy asks Linux for huge pages (2 MiB) on large arrays, so writing the first slots of
    every row made the whole table resident (a 1 MiB row per request slot at a 131k context)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size == 0:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, size)  # anonymous, private to this process, zero-filled on first touch
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux only; elsewhere the OS gives no huge pages unasked
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype).reshape(shape)


class PageTable:
    def __init__(self, num_rows: int, max_len: int):
        self.max_len = max_len
        # lazily backed by the OS, so a long max_len costs only the slots written
        self.table = lazy_zeros((num_rows, max_len), np.int64)
        self._free_rows = list(range(num_rows - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def acquire(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free page-table row (more running requests than rows)")
        return self._free_rows.pop()

    def release(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: np.ndarray) -> None:
        self.table[row, start:start + len(slots)] = slots

    def read(self, row: int, start: int, end: int) -> np.ndarray:
        return self.table[row, start:end]
