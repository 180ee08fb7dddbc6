"""Eager steps (prefill chunks, alone or beside a few decodes) as one CUDA graph each,
attention and LM head included (``engine.whole_step_graphs``; flashinfer on CUDA).

Why: a piecewise eager step (testbed/engine/piecewise_graphs.py) still enqueues L + 1 graphs, L
attention calls and an eager LM head: 1.1-2.4 ms of host time on the H200 machine, against
0.3-1.0 ms for the whole step as one graph (benchmarks/results/engine/README.md, "Eager steps
as one CUDA graph"). At light load a request's TTFT holds that launch, and the launch follows
the host's speed, which moves by ~1.5x on that machine.

flashinfer's batch-prefill wrapper has a CUDA-graph mode: a fixed batch size, its metadata in
fixed buffers, planned on the host before each replay. So for each padded token count `s` (the
piecewise sizes up to MAX_TOKENS) and request slots `k` (SLOTS) one graph runs: the pieces'
work, attention over the wrapper's plan, and the head on each slot's last row. A step of T
tokens and b < k requests plans its requests, then one padding request holding the s - T
padding rows (over as many scratch slots: the rows attend to their own scratch keys, are never
read back), then empty requests (no rows) up to k.

Which steps: those whose query tile the graph's plan picks as the eager plan would. The graph
plan takes its tile from the most rows one request of the graph could hold, the eager plan from
the batch's mean rows (flashinfer's rule, fit.fa2_query_tile: packed rows > 64 -> 128, > 16 ->
64, else 16). Where they differ (a short chunk beside many decode rows) the graph
ran 7-15% longer on Qwen3-0.6B; where they agree 0-3% (a chunk beside three decodes +0.9%).
The rule is fit.WholeStepRule, which the simulator's cost model applies to price these steps'
launch (a profile measured with the graphs records it). At light load in `chunked` most prefill
chunks run beside a median of 4-5 decodes, so the slots go up to 16 (15 requests): there the
prefill steps' median launch fell from 1.7-2.6 to 0.7-1.2 ms, mean TTFT by 3-7% in two light cells
(benchmarks/results/engine/README.md).

One wrapper per graph (its plan's grid and tile are the graph's); their int workspaces and KV
page-id buffers are one shared buffer each (each graph's plan is copied in just before its
replay, in stream order)."""
from __future__ import annotations

import numpy as np
import torch

from testbed.sim.costmodel.fit import WholeStepRule

__all__ = ["MAX_TOKENS", "SLOTS", "WholeStepGraphs", "WholeStepGraph"]

MAX_TOKENS = 1024  # light-load prompts and `chunked`'s budget-sized chunks

SLOTS = (2, 4, 8, 16)  # request slots: batches of 1-15 requests (one slot is the padding request's)
INT_WORKSPACE_BYTES = 1 << 20  # a plan of <= 1,024 rows over <= 16 requests needs a few KB


class WholeStepGraph:
    """One step of up to `s` tokens and `slots` - 1 requests, captured whole. Any batch of
    those sizes replays in it (benchmarks/exp_full_graph_eager.py runs any); the engine gives it
    the steps WholeStepGraphs.key takes."""

    def __init__(self, pieces, s: int, slots: int, int_workspace: torch.Tensor, kv_indices: torch.Tensor, pool):
        import flashinfer

        self.pieces, self.s, self.slots = pieces, s, slots
        backend, dev = pieces.backend, pieces.device
        i32 = dict(dtype=torch.int32, device=dev)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            backend.workspace, kv_layout="NHD", use_cuda_graph=True, backend=backend.prefill_backend,
            qo_indptr_buf=torch.empty(slots + 1, **i32), paged_kv_indptr_buf=torch.empty(slots + 1, **i32),
            paged_kv_indices_buf=kv_indices,
            paged_kv_last_page_len_buf=torch.empty(slots, **i32))
        self.wrapper.reset_workspace_buffer(backend.workspace, int_workspace)
        self.last = torch.full((slots,), s - 1, dtype=torch.int64, device=dev)  # each slot's last row
        # planned once with the most rows one request can hold: the graph's grid and query tile
        most = s - (slots - 1)
        self.plan(np.array([most] + [1] * (slots - 1)), np.array([most] + [1] * (slots - 1)),
                  torch.full((s,), pieces.scratch_slot, **i32))
        fns = [pieces._piece_fn(s, i) for i in range(pieces.num_layers + 1)]
        pool_kv = backend.pool

        @torch.inference_mode()
        def step():
            fns[0]()
            for layer in range(pieces.num_layers):
                self.wrapper.run(pieces.q[:s], pool_kv.paged(layer), out=pieces.o[:s])
                fns[layer + 1]()
            return pieces.model.head(pieces.x[:s], pieces.res[:s], self.last)
        step()  # once outside the graph: allocations, autotuning
        torch.cuda.synchronize(dev)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = step()

    def plan(self, qo_lens: np.ndarray, kv_lens: np.ndarray, kv_indices: torch.Tensor) -> None:
        b = self.pieces.backend
        qo = torch.zeros(len(qo_lens) + 1, dtype=torch.int32)
        qo[1:] = torch.from_numpy(np.cumsum(qo_lens).astype(np.int32))
        kv = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
        kv[1:] = torch.from_numpy(np.cumsum(kv_lens).astype(np.int32))
        # page size 1 (key() asks it): a page a token, every last page full
        self.wrapper.plan(qo, kv, kv_indices, torch.ones(len(kv_lens), dtype=torch.int32), b.num_qo_heads,
                          b.num_kv_heads, b.head_dim, 1, causal=True, **b._options())

    def prepare(self, fb) -> None:
        """Plan the batch's attention (its requests, the padding request, empty ones up to the
        slots) and copy its tokens into the fixed buffers."""
        p, s, T = self.pieces, self.s, fb.num_tokens
        ext, ctx = np.diff(fb.host_qo_indptr().numpy()), np.diff(fb.host_kv_indptr().numpy())
        pad, empty = s - T, self.slots - len(ext) - 1
        scratch = torch.full((max(pad, 1) + empty,), p.scratch_slot, dtype=torch.int32, device=p.device)
        self.plan(np.concatenate([ext, [pad], np.zeros(empty, np.int64)]),
                  np.concatenate([ctx, [max(pad, 1)], np.ones(empty, np.int64)]),
                  torch.cat([fb.kv_indices.to(torch.int32), scratch]))
        p.ids[:T].copy_(fb.input_ids)
        p.pos[:T].copy_(fb.positions)
        p.loc[:T].copy_(fb.out_cache_loc)
        if pad:
            p.loc[T:s].fill_(p.scratch_slot)
        self.last[:len(ext)].copy_(torch.from_numpy(np.cumsum(ext) - 1), non_blocking=True)

    @torch.inference_mode()
    def run(self, fb) -> torch.Tensor:
        """Logits [requests, vocab] of the batch."""
        self.prepare(fb)
        self.graph.replay()
        return self.logits[:fb.batch_size]


class WholeStepGraphs:
    """The whole-step graphs of a PiecewiseGraphs (whose fixed buffers and pieces they replay):
    ``graphs[key(fb)].run(fb)`` as ``PiecewiseGraphs.run(fb)`` for the steps ``key`` takes."""

    def __init__(self, pieces, max_context: int, max_tokens: int = MAX_TOKENS, slots=SLOTS):
        """max_context: the longest request (prompt + output) the engine holds."""
        self.pieces = pieces
        self.group = pieces.backend.num_qo_heads // pieces.backend.num_kv_heads  # packed rows a query row
        self.sizes = [s for s in pieces.sizes if s <= max_tokens]
        self.slots = tuple(slots)
        self.max_tokens = self.sizes[-1] if self.sizes else 0
        self.rule = WholeStepRule(tuple(self.sizes), self.slots, self.group) if self.sizes else None
        # the page ids of a step: its requests' contexts, the padding rows' and empty slots' scratch
        self.max_kv = (self.slots[-1] - 1) * max_context + self.max_tokens + self.slots[-1]
        kv_indices = torch.empty(self.max_kv, dtype=torch.int32, device=pieces.device)
        int_workspace = torch.empty(INT_WORKSPACE_BYTES, dtype=torch.uint8, device=pieces.device)
        pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], WholeStepGraph] = {}
        for s in reversed(self.sizes):  # largest first: the smaller ones reuse its memory
            for k in self.slots:
                if s >= k:
                    self.graphs[(s, k)] = WholeStepGraph(pieces, s, k, int_workspace, kv_indices, pool)
        torch.cuda.synchronize(pieces.device)

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    def key(self, fb) -> tuple[int, int] | None:
        """(padded tokens, request slots) of the graph that runs this step, or None (it stays
        piecewise): an eager step the rule takes (fit.WholeStepRule, which the simulator's cost
        model applies too; the module docstring says why) whose page ids fit the buffer."""
        if fb.is_decode or fb.page_size != 1:
            return None
        key = self.rule.graph(fb.num_tokens, fb.batch_size)
        if key is None or int(fb.host_kv_indptr()[-1]) + self.max_tokens + self.slots[-1] > self.max_kv:
            return None
        return key
