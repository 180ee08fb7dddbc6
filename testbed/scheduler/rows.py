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
        self._flat = self.page_table.table.reshape(-1)  # the same memory (a C-contiguous table), one index a slot
        if not np.may_share_memory(self._flat, self.page_table.table):
            raise RuntimeError("the page table is not contiguous: its flat view would be a copy")
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

    def page_needs(self, reqs: list[Request], num_tokens: list[int]) -> tuple[list[int], list[int]]:
        """(new pages each item needs for its tokens this step, pages each already has). Plain
        lists: a plan is tens to hundreds of items, where a numpy array per list cost more
        in its making than the arithmetic it saved."""
        held = [r.num_pages for r in reqs]
        P = self.page_size
        if P == 1:  # a comparison, not a max() call per item (this runs for every item every step)
            needs = [k if (k := r.cached_len + n - h) > 0 else 0 for r, n, h in zip(reqs, num_tokens, held)]
        else:
            needs = [max(0, -(-(r.cached_len + n) // P) - h) for r, n, h in zip(reqs, num_tokens, held)]
        return needs, held

    def map_new_pages(self, reqs: list[Request], needs: list[int], held: list[int], pages: np.ndarray) -> None:
        """Write every item's new pages (page_needs' two lists) into its row in one scatter."""
        P = self.page_size
        table = self.page_table.table
        if P == 1 and len(pages) == len(needs) - needs.count(0):  # a page for each item needing any (decodes)
            # into the table's flat view: one list of positions, not two to expand
            W = table.shape[1]
            self._flat[[r.row * W + h for r, k, h in zip(reqs, needs, held) if k]] = pages
        else:
            has = [i for i, k in enumerate(needs) if k]
            rows = [reqs[i].row for i in has]
            first = [held[i] for i in has]  # each item's first new page's number in its row
            if len(has) == len(pages):  # one new page per item: no expansion
                row_of, page_no = rows, first
            else:
                k = np.array([needs[i] for i in has], np.int64)
                item = np.repeat(np.arange(len(has)), k)
                page_no = np.asarray(first, np.int64)[item] + (np.arange(len(pages)) - np.repeat(np.cumsum(k) - k, k))
                row_of = np.asarray(rows, np.int64)[item]
            if P == 1:
                table[row_of, page_no] = pages
            else:
                offs = np.arange(P)
                table[np.asarray(row_of, np.int64)[:, None], np.asarray(page_no, np.int64)[:, None] * P + offs] = \
                    pages[:, None] * P + offs
        for r, k in zip(reqs, needs):
            if k:
                r.num_pages += k
