"""The `none` prefix cache: shares nothing, holds nothing, evicts nothing."""
from __future__ import annotations

import numpy as np


class NoPrefixCache:
    shares = False

    def __init__(self, page_size: int, eviction_key=None):
        self.page_size = page_size
        self.root = None
        self.cached_pages = 0
        self.evictable_pages = 0
        self.evicted_pages_total = 0

    def peek(self, ids) -> int:
        return 0

    def peek_cost(self, ids) -> tuple[int, int]:
        return 0, 0

    def match(self, ids, priority: int = 0, count_hit: bool = True):
        return None, 0, np.zeros(0, np.int64)

    def unhit(self, node) -> None:
        pass

    def lock(self, node) -> None:
        pass

    def unlock(self, node) -> None:
        pass

    def insert(self, ids, pages, priority: int = 0) -> int:
        # "already held" for every token: the caller keeps and frees all its pages
        return len(pages) * self.page_size

    def evict(self, num_pages: int) -> np.ndarray:
        return np.zeros(0, np.int64)

    def all_pages(self) -> np.ndarray:
        return np.zeros(0, np.int64)

    def check(self) -> None:
        pass
