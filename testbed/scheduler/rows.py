"""Page-table rows: which running request holds which row, how many new pages a plan's
items need, and writing those pages into the rows."""
from __future__ import annotations

import numpy as np

from testbed.core import Request
from testbed.kv import PageTable


class RowManager:
    def __init__(self, num_rows: int, max_context: int, page_size: int):
        self.page_size = page_size
        self.page_table = PageTable(num_rows, -(-max_context // page_size) * page_size)
        # row -> the running request holding it; the plan check reads it directly (hot loop)
        self.owners: list[Request | None] = [None] * num_rows

    @property
    def num_free(self) -> int:
        return self.page_table.num_free_rows

    def acquire(self, r: Request) -> None:
        r.row = self.page_table.acquire()
        self.owners[r.row] = r

    def release(self, r: Request) -> None:
        self.owners[r.row] = None
        self.page_table.release(r.row)
        r.row = -1

    def pages(self, r: Request, start: int, end: int) -> np.ndarray:
        """Page ids behind positions [start, end) of r's row (both page aligned)."""
        P = self.page_size
        return self.page_table.table[r.row, start:end:P] // P

    def write(self, r: Request, start: int, slots: np.ndarray) -> None:
        self.page_table.write(r.row, start, slots)

    def page_needs(self, reqs: list[Request], num_tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(new pages each item needs for its tokens this step, pages each already has)."""
        n = len(reqs)
        end = np.fromiter((r.cached_len for r in reqs), np.int64, n) + np.asarray(num_tokens, np.int64)
        held = np.fromiter((r.num_pages for r in reqs), np.int64, n)
        P = self.page_size
        return np.maximum(0, (end if P == 1 else -(-end // P)) - held), held

    def map_new_pages(self, reqs: list[Request], needs: np.ndarray, held: np.ndarray, pages: np.ndarray) -> None:
        """Write every item's new pages (page_needs' two arrays) into its row in one scatter."""
        P = self.page_size
        has = np.flatnonzero(needs)
        k = needs[has]
        rows = np.fromiter((reqs[i].row for i in has.tolist()), np.int64, len(has))
        item = np.repeat(np.arange(len(has)), k)
        page_no = held[has][item] + (np.arange(len(pages)) - np.repeat(np.cumsum(k) - k, k))
        table = self.page_table.table
        if P == 1:
            table[rows[item], page_no] = pages
        else:
            offs = np.arange(P)
            table[rows[item][:, None], page_no[:, None] * P + offs] = pages[:, None] * P + offs
        for i, kk in zip(has.tolist(), k.tolist()):
            reqs[i].num_pages += kk
