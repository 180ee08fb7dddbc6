"""CUDA graphs for decode batches (flashinfer backend).

One graph per padded batch size up to `max_bs`, captured at start. A decode batch of B
requests runs in the smallest graph of size >= B: the extra rows are padding the scheduler
never sees -- each reads and writes one scratch KV page that the scheduler never hands out,
and their logits are dropped. Attention metadata lives in fixed buffers that the decode
wrapper's plan() refills before each replay; plan itself stays outside the graph."""
from __future__ import annotations

import torch

from testbed.engine.forward_batch import ForwardBatch, paged_kv_layout


def graph_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_bs] + list(range(16, max_bs, 16)) + [max_bs]
    return sorted(set(sizes))


class DecodeGraphs:
    def __init__(self, model, device: torch.device, max_bs: int, scratch_page: int, max_pages_per_req: int):
        backend = model.attn_backend
        if not hasattr(backend, "graph_decode_wrapper"):
            raise ValueError(f"CUDA graphs need the flashinfer attention backend, not {backend.name!r}; "
                             f"set engine.cuda_graph_max_bs=0")
        self.model, self.backend, self.device = model, backend, device
        self.page_size = model.attn_backend.kv_pool.page_size
        self.scratch_page = scratch_page
        self.scratch_slot = scratch_page * self.page_size
        self.sizes = graph_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        i32, i64 = torch.int32, torch.int64
        self.ids = torch.zeros(self.max_bs, dtype=i64, device=device)
        self.pos = torch.zeros(self.max_bs, dtype=i64, device=device)
        self.loc = torch.full((self.max_bs,), self.scratch_slot, dtype=i32, device=device)
        self.indices = torch.zeros(self.max_bs * max_pages_per_req, dtype=i32, device=device)
        # per size: the graph, its output, its wrapper, and its static batch (kept alive: the
        # graph reads those tensors' memory at every replay)
        self.graphs, self.logits, self.wrappers, self.static = {}, {}, {}, {}
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):  # largest first: the smaller ones reuse its memory
            self.wrappers[bs] = backend.graph_decode_wrapper(bs, self.indices)
            fb = self.static[bs] = self._static_batch(bs)
            self._plan(bs, torch.arange(bs + 1, dtype=i32), torch.full((bs,), scratch_page, dtype=i32, device=device),
                       torch.ones(bs, dtype=i32))
            for _ in range(2):  # warm up outside the graph (allocator, lazy inits)
                model.forward_prepared(fb)
            torch.cuda.synchronize(device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.logits[bs] = model.forward_prepared(fb)
            self.graphs[bs] = g
        torch.cuda.synchronize(device)

    def _static_batch(self, bs: int) -> ForwardBatch:
        arange = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
        return ForwardBatch(self.ids[:bs], self.pos[:bs], arange, arange, self.indices[:bs], self.loc[:bs],
                            is_decode=True, page_size=self.page_size)

    def _plan(self, bs, page_indptr, page_ids, last_page_len) -> None:
        self.backend.plan_decode(self.wrappers[bs], page_indptr, page_ids, last_page_len, self.page_size)

    def fits(self, fb: ForwardBatch) -> bool:
        return fb.batch_size <= self.max_bs

    def run(self, fb: ForwardBatch) -> torch.Tensor:
        B = fb.batch_size
        bs = next(s for s in self.sizes if s >= B)
        pad = bs - B
        self.ids[:B].copy_(fb.input_ids)
        self.pos[:B].copy_(fb.positions)
        self.loc[:B].copy_(fb.out_cache_loc)
        indptr, page_ids, last = paged_kv_layout(fb.host_kv_indptr(), fb.kv_indices, self.page_size)
        if pad:
            # padding rows: one token each in the scratch page, written to the scratch slot;
            # their token ids and positions are what earlier steps left there (valid values)
            self.loc[B:bs].fill_(self.scratch_slot)
            indptr = torch.cat([indptr, indptr[-1] + torch.arange(1, pad + 1, dtype=indptr.dtype)])
            last = torch.cat([last, torch.ones(pad, dtype=last.dtype)])
        self._plan(bs, indptr, page_ids, last)  # copies page_ids into self.indices[:P]
        if pad:  # the padding rows' page ids follow the real ones (after plan's copy, in stream order)
            P = page_ids.numel()
            self.indices[P:P + pad].fill_(self.scratch_page)
        self.graphs[bs].replay()
        return self.logits[bs][:B]
