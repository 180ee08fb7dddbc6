"""Warm-up before the first arrival: run every kind of step a run will launch once, so
kernel compilation (Triton specialisations, flashinfer plans, cuBLAS heuristics, the
sampler) happens before the clock starts and the first run on a fresh machine times like
the next.

The shapes: prefill of one and of several requests for token counts up to the step budget
(Triton specialises integer arguments on == 1 and % 16 == 0, so counts of each kind),
prefill over a cached prefix, mixed prefill + decode, every CUDA-graph decode size, eager
decode beyond the graphs, greedy and random sampling. Each warm-up step writes only KV
slots the scheduler has not handed out yet (the pool is empty before the run)."""
from __future__ import annotations

import logging
import time

from testbed.engine.synthetic_batch import greedy_sampling, synthetic_host_batch

log = logging.getLogger(__name__)
TOKEN_COUNTS = (1, 2, 3, 15, 16, 17, 31, 32, 64, 100, 128, 255, 256, 512, 1000, 1024, 2048, 4096, 8192, 16384)


def warmup_shapes(max_tokens: int, max_running: int, graph_sizes: list[int]) -> list[tuple[list, list, float]]:
    """(extend_lens, cached_lens, temperature) of each warm-up step."""
    counts = sorted({t for t in TOKEN_COUNTS if t <= max_tokens} | {max_tokens})
    shapes = []
    for t in counts:
        shapes.append(([t], [0], 0.0))
        shapes.append(([t], [64], 0.0))  # over a cached prefix
        if t >= 8:
            k = min(8, max_running)
            shapes.append(([t // k] * k, [0] * k, 0.0))
            d = min(16, max_running - 1, t - 1)
            if d > 0:
                shapes.append(([t - d] + [1] * d, [0] + [64] * d, 0.0))  # a chunk beside decodes
    for b in graph_sizes:
        shapes.append(([1] * b, [64] * b, 0.0))
    top = graph_sizes[-1] if graph_sizes else 0
    for b in sorted({min(top + 1, max_running), max_running, 1, 2, 17} - {0}):
        if top < b <= max_running:
            shapes.append(([1] * b, [64] * b, 0.0))
    if not graph_sizes:
        shapes += [([1] * b, [64] * b, 0.0) for b in sorted({1, 2, 16, 17, max_running}) if b <= max_running]
    shapes.append(([1, 1], [64, 64], 1.0))  # the random sampler
    return shapes


def warm_up(executor, num_slots: int, page_size: int, vocab_size: int, max_tokens: int, max_running: int,
            quick: bool = False) -> float:
    """Run the warm-up steps on the executor; returns the seconds it took. quick: only a few
    small steps (the CPU compiles nothing; this keeps the path exercised)."""
    graphs = executor.graphs  # EngineExecutor's or the TP wrapper's (rank 0's)
    sizes = list(graphs.sizes) if graphs is not None else []
    shapes = warmup_shapes(min(max_tokens, 64) if quick else max_tokens, min(max_running, 4) if quick else max_running,
                           sizes[:2] if quick else sizes)
    t0 = time.perf_counter()
    prev, ran = None, 0
    for i, (ext, cac, temp) in enumerate(shapes):
        need = sum(-(-(e + c) // page_size) * page_size for e, c in zip(ext, cac))
        if need > num_slots:  # a small pool: the shapes it cannot hold never run either
            continue
        ran += 1
        hb = synthetic_host_batch(ext, cac, num_slots, page_size, vocab_size, seed=i, pending=True)  # as served
        h = executor.launch_host(hb, greedy_sampling(len(ext), temp))
        if prev is not None:  # as the run does: the next step launched before this one is collected
            executor.collect(prev)
        prev = h
    if prev is not None:
        executor.collect(prev)
    dt = time.perf_counter() - t0
    log.info("warm-up: %d steps in %.2f s", ran, dt)
    return dt
