"""How unevenly a decode CUDA graph's attention work lands on the GPU's SMs.

flashinfer's CUDA-core decode kernel (GQA groups under 4: Qwen3-0.6B's 16 query over 8 KV heads)
is captured with a split-KV plan: one launch of `grid` blocks (a padded batch of grid / kv_heads
chunks per KV head). Before each replay the plan cuts every row's context into chunks of the
smallest size (at least `min_chunk` pages) whose count fits the padded batch, and block
x + padded * head takes chunk x of that head. The blocks all run at once, so the step lasts as
long as its busiest SM takes to stream its blocks' KV. A batch of equal contexts splits into equal
blocks spread evenly; a batch whose contexts differ by +-20% gets chunks of unequal sizes that
pile up on some SMs: measured on the H200, such a batch ran 15% longer at 96 rows than one of equal
contexts and the same KV total, and serving batches ran like it (benchmarks/diag_decode_curve.py).
A graph too large to split (rows x kv_heads >= grid) runs a block per row and head, more blocks
than fit at once: the later ones wait for the first to finish.

`DecodePlan.load` is that busiest SM's (or, unsplit, the slowest slot's) KV tokens: the decode
graph fit's third feature. `DecodePlan.tail` is its fourth: how far the plan's longest block
(split: the chunk, or the longest row if shorter; unsplit: the longest row) runs beyond
TAIL_FREE x the mean block. Timed by kernel on the H200 (benchmarks/exp_split_kv_kernels.py), all
blocks of a split graph are resident at once and the attention kernel's time per KV token grows
with the longest block, not with the busiest SM's total: a block much longer than the others
streams on alone at the end. Page size 1 (pages are tokens), as the engine runs."""
from __future__ import annotations

import numpy as np

#: a block up to this many times the mean block ends under the others' bandwidth-bound time; the
#: tail feature counts its tokens beyond that (of 0.9-1.6, the grid fit's p90 error is least here:
#: 2.8% against 3.1-3.3% at 1.0 and 1.6, 6.5% without the feature at 96-176 rows)
TAIL_FREE = 1.25


class DecodePlan:
    def __init__(self, grid: int, kv_heads: int, sms: int, min_chunk: int = 128):
        self.grid = int(grid)  # blocks of one launch: the plan's padded batch x kv_heads
        self.kv_heads = int(kv_heads)  # KV heads per rank: the grid's second dimension
        self.sms = int(sms)  # the GPU's SMs
        self.min_chunk = int(min_chunk)  # the plan's smallest chunk, in pages
        self.slots = self.grid // self.kv_heads  # the padded batch: chunks per head
        # on_sm[s, x]: how many of chunk x's blocks (one per head) land on SM s
        x = np.arange(self.slots)
        self._on_sm = np.zeros((self.sms, self.slots))
        for head in range(self.kv_heads):
            np.add.at(self._on_sm, ((x + self.slots * head) % self.sms, x), 1.0)
        self._hint = self.min_chunk  # the last chunk: a decode batch's changes little from step to step

    def as_dict(self) -> dict:
        return {"grid": self.grid, "kv_heads": self.kv_heads, "sms": self.sms, "min_chunk": self.min_chunk}

    def _count(self, lens: np.ndarray, c: int) -> int:
        return int(((lens + c - 1) // c).sum())

    def chunk(self, lens: np.ndarray) -> int:
        """The plan's chunk: the least c >= min_chunk with sum(ceil(len / c)) <= the padded batch
        (searched from the last answer; the same answer as a plain binary search)."""
        total, rows = int(lens.sum()), len(lens)
        lo = max(self.min_chunk, -(-total // self.slots))  # fewer chunks than the total over the slots
        hi = max(int(lens.max()), self.min_chunk)  # one chunk a row always fits (rows < slots)
        if self.slots > rows:  # c >= total / (slots - rows) gives at most total / c + rows chunks
            hi = max(lo, min(hi, -(-total // (self.slots - rows))))
        h = min(max(self._hint, lo), hi)
        if self._count(lens, h) <= self.slots:
            if h == lo or self._count(lens, h - 1) > self.slots:
                return h
            hi = h - 1
        else:
            lo = h + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._count(lens, mid) > self.slots:
                lo = mid + 1
            else:
                hi = mid
        self._hint = lo
        return lo

    def load(self, lens) -> float:
        """KV tokens of the busiest SM (split) or of the last block to finish (unsplit); `lens`: every
        row's context, the graph's padding rows (one token each) included."""
        return self.features(lens)[0]

    def tail(self, lens) -> float:
        """Tokens of the plan's longest block beyond TAIL_FREE x its mean block (lens as load's)."""
        return self.features(lens)[1]

    def features(self, lens) -> tuple[float, float]:
        """(load, tail) of a batch at once: the cost model's per-step call."""
        lens = np.maximum(np.asarray(lens, np.int64), 1)
        rows = len(lens)
        if rows * self.kv_heads < self.grid:
            c = self.chunk(lens)
            k = (lens + c - 1) // c
            work = np.full(int(k.sum()), c, float)
            work[np.cumsum(k) - 1] = lens - c * (k - 1)  # each row's last chunk holds the rest
            load = float((self._on_sm[:, : len(work)] @ work).max())
            return load, max(0.0, float(work.max()) - TAIL_FREE * float(work.mean()))
        # one block per row and head, in block order; those beyond the grid start as the first finish
        tail = max(0.0, float(lens.max()) - TAIL_FREE * float(lens.mean()))
        work = np.tile(lens, self.kv_heads)
        first, rest = work[: self.grid], work[self.grid:]
        if not len(rest):
            return float(first.max()), tail
        return float(max(first.max(), (np.sort(first)[: len(rest)] + rest).max())), tail
