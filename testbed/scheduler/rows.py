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
        self._offs = np.arange(page_size, dtype=np.int64)  # a page's slots after its first
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
        """Write every item's new pages (page_needs' two lists; `pages` in item order) into its
        row, and count them in its num_pages. Through the table's flat view: an item's new
        pages are consecutive slots of its row, so a many-page item (a prefill chunk) is one
        slice, and the one-page items (decodes) one scatter, their positions a plain list (a
        decode step's hundreds of items cost less so than numpy index arithmetic)."""
        P = self.page_size
        W = self.page_table.table.shape[1]
        flat = self._flat
        pos = []  # each needing item's first new slot, flat
        runs = []  # many-page items: (first slot, pages, offset in `pages`)
        off = 0
        for r, k, h in zip(reqs, needs, held):
            if k:
                b = r.row * W + h * P
                pos.append(b)
                if k > 1:
                    runs.append((b, k, off))
                off += k
                r.num_pages = h + k
        if runs:  # each run's pages as a slice; the scatter below takes each item's first page
            first = np.ones(len(pages), bool)
            for b, k, o in runs:
                first[o + 1:o + k] = False
                flat[b:b + k * P] = (pages[o:o + k, None] * P + self._offs).reshape(-1) if P > 1 else pages[o:o + k]
            pages = pages[first]
        if P == 1:
            flat[pos] = pages
        else:
            flat[np.add.outer(np.asarray(pos, np.int64), self._offs)] = np.add.outer(pages * P, self._offs)
