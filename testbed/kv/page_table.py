"""Page table: (request slot, position) -> raw KV slot, one row per running request."""
from __future__ import annotations

import numpy as np


class PageTable:
    def __init__(self, num_rows: int, max_len: int):
        self.max_len = max_len
        # np.zeros is lazily backed by the OS, so a long max_len costs only the rows touched
        self.table = np.zeros((num_rows, max_len), dtype=np.int64)
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
