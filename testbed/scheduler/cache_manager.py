"""The prefix cache and the page pool as the scheduler uses them: a request's matched
prefix locked and mapped into its row at admission, its computed KV shared back into the
cache, its own pages freed, and eviction when the pool runs short.

A request's row holds `shared_len` leading tokens on pages the cache holds (locked through
`cache_node`), then its own pages up to `num_pages`. `owned_pages` counts the requests' own
pages as they are handed out and given up, apart from the pool's and the cache's counts, so a
step's record of used + cached + free pages can disagree with the pool's total when a page is
lost."""
from __future__ import annotations

import numpy as np

from testbed.core import Request
from testbed.kv import IntegrityError, PageAllocator, check_kv_integrity
from testbed.scheduler.rows import RowManager


class CacheManager:
    def __init__(self, cache, allocator: PageAllocator, rows: RowManager):
        self.cache = cache
        self.allocator = allocator
        self.rows = rows
        self.page_size = rows.page_size
        self.owned_pages = 0  # the requests' own pages (not the cache's), counted at every hand-over

    @property
    def available_pages(self) -> int:
        """Free pages plus those eviction could free."""
        return self.allocator.free_pages + self.cache.evictable_pages

    # ---- admission ----------------------------------------------------------------------------
    def match(self, r: Request) -> int:
        """Lock the cached prefix of r's known tokens (all but the last, which is always
        computed), map it into r's row and return its length."""
        ids = None
        if r.prompt_ids is not None and self.cache.shares:
            ids = r.prompt_ids if r.device_len == r.prompt_len else r.token_ids(r.device_len)
            ids = ids[: r.device_len - 1]
        node, hit, pages = self.cache.match(ids, r.priority)
        if hit:
            self.cache.lock(node)
            r.cache_node = node
            self.rows.write(r, 0, self.allocator.slots_of(pages))
        r.shared_len = hit
        return hit

    def unmatch(self, r: Request) -> None:
        """Undo match() for an admission taken back before anything ran."""
        if r.cache_node is not None:
            self.cache.unhit(r.cache_node)  # so LFU does not count an admission that did not happen
        self._unlock(r)
        r.shared_len = 0

    # ---- sharing and release ------------------------------------------------------------------
    def share_prefill(self, r: Request) -> None:
        """After a prefill: share its KV, point r's row at the cache's pages and move the
        lock to the node that now ends r's shared prefix."""
        ids = self._insert(r)
        if ids is None:
            return
        self.owned_pages -= (len(ids) - r.shared_len) // self.page_size  # now the cache's, or freed copies
        node, got, tree_pages = self.cache.match(ids, r.priority, count_hit=False)
        assert got == len(ids), (got, len(ids))
        self.rows.write(r, 0, self.allocator.slots_of(tree_pages))
        self.cache.lock(node)
        self._unlock(r)
        r.cache_node = node
        r.shared_len = len(ids)

    def release(self, r: Request) -> None:
        """Share r's computed KV, free the rest of its pages, give up its lock and row."""
        self.owned_pages -= r.num_pages - r.shared_len // self.page_size  # shared back, or freed
        ids = self._insert(r)
        own_from = r.shared_len if ids is None else len(ids)
        self.allocator.free(self.rows.pages(r, own_from, r.num_pages * self.page_size))
        self._unlock(r)
        self.rows.release(r)
        r.num_pages = r.shared_len = 0

    def _insert(self, r: Request) -> np.ndarray | None:
        """Insert r's computed, page-aligned prefix into the cache if it reaches beyond
        r.shared_len, freeing r's copies of what the cache held already. Returns the ids
        inserted (the cache now holds the pages of all of them), or None."""
        P = self.page_size
        kv_len = min(r.cached_len, r.prompt_len + len(r.output_ids))  # tokens whose ids and KV exist
        aligned = kv_len // P * P
        if r.prompt_ids is None or not self.cache.shares or aligned <= r.shared_len:
            return None
        ids = r.token_ids(aligned)
        had = self.cache.insert(ids, self.rows.pages(r, 0, aligned), r.priority)
        if had > r.shared_len:  # our copies of what the tree already had
            self.allocator.free(self.rows.pages(r, r.shared_len, had))
        return ids

    def _unlock(self, r: Request) -> None:
        if r.cache_node is not None:
            self.cache.unlock(r.cache_node)
            r.cache_node = None

    # ---- the pool -----------------------------------------------------------------------------
    def alloc(self, n: int) -> tuple[np.ndarray, int]:
        """n free pages, evicting unreferenced cache pages first if too few are free;
        returns them and the number evicted."""
        evicted = 0
        short = n - self.allocator.free_pages
        if short > 0:
            freed = self.cache.evict(short)
            self.allocator.free(freed)
            evicted = len(freed)
        pages = self.allocator.alloc(n)
        self.owned_pages += len(pages)  # each goes into a request's row (PrefillAdder.fit)
        return pages, evicted

    def own_pages(self, r: Request) -> np.ndarray:
        return self.rows.pages(r, r.shared_len, r.num_pages * self.page_size)

    def shared_pages(self, r: Request) -> np.ndarray:
        return self.rows.pages(r, 0, r.shared_len)

    # ---- the check ----------------------------------------------------------------------------
    def check(self, live: list[Request], waiting: list[Request]) -> dict:
        """The KV integrity check over the requests holding rows (live) and those that must
        hold none (waiting); returns the page counts."""
        owned, shared = [], []
        for r in live:
            if not (0 <= r.shared_len <= r.cached_len <= r.device_len <= r.max_len):
                raise AssertionError(f"request {r.rid}: lengths out of order: shared {r.shared_len} "
                                     f"cached {r.cached_len} device {r.device_len} max {r.max_len}")
            if r.num_pages * self.page_size < r.cached_len:
                raise AssertionError(f"request {r.rid}: {r.cached_len} cached tokens on {r.num_pages} pages")
            owned.append(self.own_pages(r))
            shared.append(self.shared_pages(r))
        for r in waiting:
            if r.row != -1 or r.cached_len != 0:
                raise AssertionError(f"waiting request {r.rid} holds KV")
        counts = check_kv_integrity(self.allocator, self.cache, owned, shared)
        if counts["in_use"] != self.owned_pages:
            raise IntegrityError(f"the requests hold {counts['in_use']} own pages; {self.owned_pages} were counted "
                                 f"handed out and not given back")
        return counts
