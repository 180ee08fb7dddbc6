"""An eager step's batch as the calibrated model prices it: its prompt rows' lengths as Python
ints, its decode rows as a few sums, and the terms of its price, each computed once.

The simulator prices every eager step (a prefill chunk beside decodes, most of `chunked`'s
steps): the fa2 plan's emulation, its busiest-SM load, the extra terms over the base curve and
the local correction's place. Done with numpy on arrays of 5-40 rows, that was ~20 calls and
150-240 us a step on the project's 2-core machine, most of it call overhead; the same integer
arithmetic over lists takes a fraction of it, and over the decode rows' sums (a 256-row step is
nearly all decodes) less again. Every term is an integer until its last float operation, which is
the one numpy did, so the floats are the same bit for bit."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

FA2_TILES = (16, 64, 128)
SHORT_BATCH = 32  # rows up to which a batch's sums are cheaper in Python than in numpy


@dataclass(frozen=True)
class Fa2Shape:
    """What flashinfer's fa2 batch-prefill plan depends on beyond the batch: query heads per KV
    head, KV heads (of one TP rank), the GPU's SMs, the page size."""
    group: int
    kv_heads: int
    num_sms: int
    page_size: int = 1


def fa2_query_tile(packed_rows):
    """The fa2 plan's query tile for a packed query length (the batch's mean in an eager plan;
    the most rows a request could hold in a CUDA-graph plan, testbed/engine/whole_graphs.py);
    an int, or an array of them for an array."""
    if isinstance(packed_rows, np.ndarray):
        return np.where(packed_rows > 64, 128, np.where(packed_rows > 16, 64, 16))
    return 128 if packed_rows > 64 else 64 if packed_rows > 16 else 16


class EagerBatch:
    """Rows extending by extend[i] new tokens over cached[i] cached ones. The rows that extend by
    more than one token (prompt chunks) are kept as int lists; the decode rows (one token each),
    most of a large mixed step's, only as their count, their cached sum and the longest context:
    every term but a split plan's is a sum over rows whose decode part those give in closed form
    (a 256-row step of `chunked` cost ~110 us priced row by row in Python)."""

    __slots__ = ("_n_all", "_c_all", "n", "c", "rows", "tokens", "cached", "decodes", "dec_cached",
                 "longest")

    def __init__(self, extend, cached, sums: tuple[int, int] | None = None):
        """sums: (the new tokens, the cached ones) when the caller has them."""
        n = np.asarray(extend, np.int64)
        c = np.asarray(cached, np.int64)
        self._n_all, self._c_all = n, c  # every row, for the split plan's search
        self.rows = len(n)
        if self.rows <= SHORT_BATCH:  # in Python: numpy's per-call overhead is most of it
            nl, cl = n.tolist(), c.tolist()
            self.tokens, self.cached = sum(nl), sum(cl)
            self.longest = max(map(int.__add__, nl, cl))
            pre = [i for i, a in enumerate(nl) if a != 1]
            self.n, self.c = [nl[i] for i in pre], [cl[i] for i in pre]
        else:
            self.tokens, self.cached = sums if sums is not None else (int(n.sum()), int(c.sum()))
            self.longest = int((n + c).max())  # the longest context
            if self.tokens == self.rows:  # decodes only
                self.n, self.c = [], []
            else:
                pre = np.flatnonzero(n != 1)
                self.n, self.c = n[pre].tolist(), c[pre].tolist()
        self.decodes = self.rows - len(self.n)
        self.dec_cached = self.cached - sum(self.c)  # the decode rows' cached tokens

    def attn_work(self) -> float:
        """The (query, key) pairs under the causal mask: sum of n (c + (n + 1) / 2), in ints (a
        decode row's pairs: c + 1)."""
        return float(sum(a * b for a, b in zip(self.n, self.c)) + self.dec_cached
                     + (sum(a * (a + 1) for a in self.n) + 2 * self.decodes) // 2)

    def imbalance(self) -> float:
        """Rows x the longest context - the KV tokens (0 when every row is as long)."""
        return float(self.rows * self.longest - (self.tokens + self.cached))

    def fa2_plan(self, fa: Fa2Shape) -> tuple[int, int, int]:
        """(query tile, KV chunk in tokens, work items) of flashinfer's fa2 batch-prefill plan: the
        query tile from the mean packed query length (tokens x group: > 64 -> 128, > 16 -> 64,
        else 16); each request's tiles x KV chunks are the work items, one thread block per item
        and KV head, and the KV chunk is the smallest that keeps the items within two blocks per
        SM. The rules as flashinfer 0.6 plans (include/flashinfer/attention/scheduler.cuh, read
        there; written here)."""
        P, g = fa.page_size, fa.group
        tile = fa2_query_tile(self.tokens * g // self.rows)
        dec_tiles = -(-g // tile)  # a decode row's query tiles
        total = sum(-(-(x * g) // tile) for x in self.n) + dec_tiles * self.decodes
        limit = max(1, 2 * fa.num_sms // fa.kv_heads)
        lo, hi = max(128 // P, 1), max(-(-self.longest // P), 1)  # pages (a row extends by 1 at least)
        if total > limit:  # more query tiles than the limit: no chunk fits, none is split
            # the chunk holds the longest row: each row's items are its tiles
            return tile, max(lo, hi) * P, total
        # the smallest chunk whose items fit the limit: at most `limit` rows, each one's pages
        ctx = (self._n_all + self._c_all).tolist()
        kv = ctx if P == 1 else [max(-(-x // P), 1) for x in ctx]
        pairs = list(zip((-(-(x * g) // tile) for x in self._n_all.tolist()), kv))
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(t * -(-k // mid) for t, k in pairs) > limit:
                lo = mid + 1
            else:
                hi = mid
        chunk = max(lo, 1)
        return tile, chunk * P, sum(t * -(-k // chunk) for t, k in pairs)

    def fa2_load(self, fa: Fa2Shape, plan: tuple[int, int, int] | None = None) -> float:
        """The KV tokens the busiest SM works through under the plan (its query tile's column of
        FA2_FEATURES). When every block is resident at once (at most two an SM): its longest
        work item, twice over when two blocks share an SM, or the KV tokens all blocks attend to
        spread over the SMs when that is more; when the blocks run in waves: that spread plus one
        longest item (the last wave's tail). Causal: a query tile attends to the prefix and the
        new tokens up to its last row. plan: fa2_plan's, when the caller has it."""
        tile, chunk, items = plan or self.fa2_plan(fa)
        rows = max(tile // fa.group, 1)  # new tokens a query tile holds
        k = self.n if rows == 1 else [-(-x // rows) for x in self.n]  # each row's query tiles (a decode's: 1)
        d = self.decodes
        # the KV tokens its tiles attend to, sum of k c + rows k (k + 1) / 2 - (k rows - n), in ints
        attended = (sum(a * b for a, b in zip(k, self.c)) + self.dec_cached
                    + rows * (sum(a * (a + 1) for a in k) + 2 * d) // 2
                    - (rows * (sum(k) + d) - self.tokens))
        spread = float(attended) * fa.kv_heads / fa.num_sms
        blocks = items * fa.kv_heads
        if blocks <= 2 * fa.num_sms:  # every block resident at once (two an SM): the longest sets the time
            return float(max(chunk * min(2, -(-blocks // fa.num_sms)), spread))
        return spread + chunk  # blocks in waves: the mean an SM takes, plus the tail of one longest item

    def local_place(self, fa: Fa2Shape, plan: tuple[int, int, int], load: float) -> tuple[tuple[int, bool], list]:
        """Where the batch lies for the local correction (fit.local_features)."""
        tile, _, items = plan
        return (tile, items * fa.kv_heads <= 2 * fa.num_sms), [
            math.log2(self.tokens), math.log2(1 + self.decodes), math.log2(1 + self.cached), math.log2(1 + load)]

    def extras(self, fa: Fa2Shape | None, base: int | None = None, plan: tuple[int, int, int] | None = None,
               load: float | None = None) -> np.ndarray:
        """What the batch has beyond the base curve's fresh prompt of ``base`` tokens (its padded
        tokens, fit.padded_tokens; None: its own tokens) (fit.EAGER_EXTRA): attention work, KV
        tokens read beyond the new ones, requests beyond one, imbalance, and the prefill kernel's
        busiest-SM load per query tile (a decode-only batch runs the decode kernel: none; fa None:
        the profile has no fa2 shape; plan, load: fa2_plan's and fa2_load's, when the caller has
        them). The base prompt is the padded one because the curve was measured at piecewise-graph
        sizes: the padding rows run the linear layers, not attention, so a 5,170-token prompt in
        the 5,632 graph attends over less than the curve's prompt did (its attention terms come
        out negative)."""
        ref = self.tokens if base is None else int(base)
        head = [self.attn_work() - ref * (ref + 1) / 2, float(self.cached), self.rows - 1.0, self.imbalance()]
        if fa is None or self.tokens == self.rows:
            return np.array(head + [0.0] * len(FA2_TILES))
        plan = plan or self.fa2_plan(fa)
        own = self.fa2_load(fa, plan) if load is None else load
        fresh_tile, fresh = _fresh_load(ref, fa)
        return np.array(head + [(own if t == plan[0] else 0.0) - (fresh if t == fresh_tile else 0.0) for t in FA2_TILES])


@functools.lru_cache(maxsize=4096)
def _fresh_load(tokens: int, fa: Fa2Shape) -> tuple[int, float]:
    """(query tile, busiest-SM load) of one fresh prompt (the base curve's), once per token count."""
    b = EagerBatch([tokens], [0])
    plan = b.fa2_plan(fa)
    return plan[0], b.fa2_load(fa, plan)
