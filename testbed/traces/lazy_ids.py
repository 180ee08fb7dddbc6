"""Prompt ids made when they are first read, a window of consecutive requests at a time.

A replay needs a request's ids from its arrival (prefix matching, the cache) to its end; made
up front, the whole bundled ShareGPT trace's took 280 MB before the first step. A loader whose
id maker is a pure function of the rows (seeded hashes that note nothing) lets the trace make
them on demand instead: the request that reads its ids makes those of the next requests by
rid (arrival order) with it, so a replay calls the id maker once per window and holds the ids
of the requests in the system and of one window. The ids are the maker's, bit for bit
(tests/test_traces.py)."""
from __future__ import annotations

import numpy as np

WINDOW_TOKENS = 1 << 18  # prompt tokens made at a time (at least one request)


class IdWindows:
    def __init__(self, name: str, make_ids, take: np.ndarray, rids: np.ndarray, lens: np.ndarray,
                 runs: np.ndarray, window_tokens: float | None = None):
        """make_ids(take, rids, lens) as Rows.make_ids; request i (rid rids[i] == i) is row
        take[i] with a prompt of lens[i] tokens; runs[i] False: it has no ids (rejected).
        window_tokens: WINDOW_TOKENS if None; inf makes every request's ids in one call."""
        self.name, self.window_tokens = name, WINDOW_TOKENS if window_tokens is None else window_tokens
        self.make_ids, self.take, self.rids, self.lens, self.runs = make_ids, take, rids, lens, runs
        self.ends = np.cumsum(lens)  # a window starting at rid i ends where window_tokens more are made
        self.lo = self.hi = 0  # the window made last: rids lo..hi-1
        self.made: list = []

    def ids(self, rid: int) -> np.ndarray | None:
        """Request rid's int32 ids (None where it has none), handed over: the window lets them
        go (asked again, they are made again, the same)."""
        if not self.runs[rid]:
            return None
        if not (self.lo <= rid < self.hi and self.made[rid - self.lo] is not None):
            self._make(rid)
        ids, self.made[rid - self.lo] = self.made[rid - self.lo], None
        return ids

    def _make(self, lo: int) -> None:
        start = self.ends[lo] - self.lens[lo]
        hi = max(lo + 1, int(np.searchsorted(self.ends, start + self.window_tokens, side="right")))
        runs = np.flatnonzero(self.runs[lo:hi]) + lo
        made: list = [None] * (hi - lo)
        for i, x in zip(runs.tolist(), self.make_ids(self.take[runs], self.rids[runs], self.lens[runs])):
            if len(x) != self.lens[i] or x.dtype != np.int32:  # cheap guard on every loader's id maker
                raise AssertionError(f"{self.name}: rid {i} got {len(x)} ids, want {self.lens[i]}")
            made[i - lo] = x
        self.lo, self.hi, self.made = lo, hi, made
