"""An eager step's batch as the calibrated model prices it: its rows' lengths as Python ints
and the terms of its price, each computed once.

The simulator prices every eager step (a prefill chunk beside decodes, most of `chunked`'s
steps): the fa2 plan's emulation, its busiest-SM load, the extra terms over the base curve and
the local correction's place. Done with numpy on arrays of 5-40 rows, that was ~20 calls and
150-240 us a step on the project's 2-core machine, most of it call overhead; the same integer
arithmetic over lists takes a fraction of it. Every term is an integer until its last float
operation, which is the one numpy did, so the floats are the same bit for bit."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

FA2_TILES = (16, 64, 128)


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
    """Rows extending by extend[i] new tokens over cached[i] cached ones (as int lists)."""

    __slots__ = ("n", "c", "rows", "tokens", "cached", "decodes", "_ctx")

    def __init__(self, extend, cached):
        self.n = extend.tolist() if hasattr(extend, "tolist") else [int(x) for x in extend]
        self.c = cached.tolist() if hasattr(cached, "tolist") else [int(x) for x in cached]
        self.rows = len(self.n)
        self.tokens = sum(self.n)
        self.cached = sum(self.c)
        self.decodes = self.n.count(1)
        self._ctx = None

    @property
    def ctx(self) -> list[int]:
        if self._ctx is None:
            self._ctx = [a + b for a, b in zip(self.n, self.c)]
        return self._ctx

    def attn_work(self) -> float:
        """The (query, key) pairs under the causal mask: sum of n (c + (n + 1) / 2), in ints."""
        return float(sum(a * b for a, b in zip(self.n, self.c)) + sum(a * (a + 1) for a in self.n) // 2)

    def imbalance(self) -> float:
        """Rows x the longest context - the KV tokens (0 when every row is as long)."""
        return float(self.rows * max(self.ctx) - (self.tokens + self.cached))

    def fa2_plan(self, fa: Fa2Shape) -> tuple[int, int, int]:
        """(query tile, KV chunk in tokens, work items) of flashinfer's fa2 batch-prefill plan: the
        query tile from the mean packed query length (tokens x group: > 64 -> 128, > 16 -> 64,
        else 16); each request's tiles x KV chunks are the work items, one thread block per item
        and KV head, and the KV chunk is the smallest that keeps the items within two blocks per
        SM. The rules as flashinfer 0.6 plans (include/flashinfer/attention/scheduler.cuh, read
        there; written here)."""
        P, g = fa.page_size, fa.group
        kv = self.ctx if P == 1 else [max(-(-x // P), 1) for x in self.ctx]  # pages (a row extends by 1 at least)
        tile = fa2_query_tile(self.tokens * g // self.rows)
        tiles = [-(-(x * g) // tile) for x in self.n]
        limit = max(1, 2 * fa.num_sms // fa.kv_heads)
        lo, hi = max(128 // P, 1), max(kv)
        total = sum(tiles)
        if total > limit:  # more query tiles than the limit: no chunk fits, none is split
            # the chunk holds the longest row: each row's items are its tiles
            return tile, max(lo, hi) * P, total
        # the smallest chunk whose items fit the limit
        pairs = list(zip(tiles, kv))
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
        k = self.n if rows == 1 else [-(-x // rows) for x in self.n]  # each row's query tiles
        # the KV tokens its tiles attend to, sum of k c + rows k (k + 1) / 2 - (k rows - n), in ints
        attended = (sum(a * b for a, b in zip(k, self.c)) + rows * sum(a * (a + 1) for a in k) // 2
                    - (rows * sum(k) - self.tokens))
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
