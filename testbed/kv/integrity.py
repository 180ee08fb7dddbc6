"""The KV integrity check: every page is in exactly one place (free, prefix cache, or one
request's own pages), and every running request's shared prefix is still in the cache."""
from __future__ import annotations

import numpy as np


class IntegrityError(AssertionError):
    pass


def check_kv_integrity(allocator, cache, owned: list[np.ndarray], shared: list[np.ndarray]) -> dict:
    """owned: each live request's own pages; shared: each live request's cache-held pages.
    Returns the page counts; raises IntegrityError naming what is wrong."""
    cache.check()
    free = allocator.free_set()
    tree = cache.all_pages()
    own = np.concatenate(owned) if owned else np.zeros(0, np.int64)
    counts = {"free": len(free), "cached": len(tree), "in_use": len(own), "total": allocator.num_pages}
    if counts["free"] + counts["cached"] + counts["in_use"] != allocator.num_pages:
        raise IntegrityError(f"KV pages do not add up: free {counts['free']} + cached {counts['cached']} "
                             f"+ in use {counts['in_use']} != total {allocator.num_pages}")
    every = np.concatenate([free, tree, own])
    if not _each_once(every, allocator.num_pages):  # the sort names what is wrong
        uniq, n = np.unique(every, return_counts=True)
        if len(uniq) != len(every):
            raise IntegrityError(f"KV pages in two places: {uniq[n > 1][:10].tolist()}")
        if len(every) and (uniq[0] < 0 or uniq[-1] >= allocator.num_pages):
            raise IntegrityError("KV page id out of range")
    if shared:
        need = np.concatenate(shared)
        lost = np.setdiff1d(need, tree)
        if len(lost):
            raise IntegrityError(f"running requests lost shared prefix pages: {lost[:10].tolist()}")
    return counts


def _each_once(pages: np.ndarray, total: int) -> bool:
    """Whether `pages` (as many as the pool's `total`) holds each id 0..total-1 once: then every
    id is in range and none is left unmarked. A mark per page, not a sort of them all (the end
    of a run checks a pool of ~1M pages: 3 ms, not 40)."""
    if not len(pages):
        return True
    if pages.min() < 0 or pages.max() >= total:
        return False
    seen = np.zeros(total, bool)
    seen[pages] = True
    return bool(seen.all())
