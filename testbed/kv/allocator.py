"""Paged KV allocator: hands out whole pages from a free stack (deterministic order)."""
from __future__ import annotations

import numpy as np


class OutOfPages(RuntimeError):
    pass


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int = 1):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # a stack: pages are taken from the top; reversed so page 0 goes first
        self._stack = np.arange(num_pages - 1, -1, -1, dtype=np.int64)
        self._top = num_pages

    @property
    def free_pages(self) -> int:
        return self._top

    def alloc(self, n: int) -> np.ndarray:
        if n > self._top:
            raise OutOfPages(f"asked for {n} pages, {self._top} free")
        self._top -= n
        return self._stack[self._top:self._top + n][::-1].copy()

    def free(self, pages: np.ndarray) -> None:
        n = len(pages)
        if n == 0:
            return
        if self._top + n > self.num_pages:
            raise RuntimeError("freeing more pages than were allocated (double free)")
        self._stack[self._top:self._top + n] = pages[::-1]
        self._top += n

    def free_set(self) -> np.ndarray:
        return self._stack[:self._top]

    def slots_of(self, pages: np.ndarray) -> np.ndarray:
        """Raw KV slots (page * page_size + offset) covering the given pages, in order."""
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1)
