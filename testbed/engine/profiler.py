"""The step profiler: the real engine (same kernels, CUDA graphs, sampler, overlap) timed
over a grid of step shapes, for the simulator's calibrated cost model.

Two kinds of measurement, because a step's time has a host part and a device part:

* **device grid**: synthetic steps of each shape (testbed/engine/synthetic_batch.py)
  launched on the executor. Each shape runs `repeats` times with the device idle at launch
  (``free_s``: what the CUDA events see when the host launches into an idle device, and the
  host's own ``prep_s`` and ``launch_s``), then `repeats` times with the device held busy
  (``torch.cuda._sleep``) until the whole step is enqueued (``device_s``: the device's own
  time, never waiting for the host). Medians.
* **host workloads**: synthetic request mixes replayed through the real step loop and
  scheduler for each policy (decode batches from ``max_running`` down to 1, prefill chunks,
  mixed steps). Each step's ``host_s`` (schedule, batch build, upload), ``launch_s`` and
  ``complete_s`` is a sample of the host cost of its shape.

``run_profile`` returns both as plain lists in a dict; ``testbed.sim.costmodel.fit.fit_profile``
turns it into the profile file the simulator reads."""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from typing import NamedTuple

import numpy as np
import torch

from testbed.core import Request, SamplingParams
from testbed.engine.synthetic_batch import greedy_sampling, synthetic_host_batch
from testbed.sim.costmodel.fit import PATTERNS, skewed_lengths, spread_lengths
from testbed.timeline.idle import idle_before

log = logging.getLogger(__name__)

PREFILL_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREFILL_CACHED = (0, 1024, 4096, 16384)  # 16384: chunks over long prefixes (Mooncake prompts are ~14k tokens)
PREFILL_REQS = (1, 4, 16)
DECODE_KV = (64, 512, 2048, 8192)
MIXED_DECODES = (8, 64, 256)
MIXED_KV = (512, 2048)
MIXED_CHUNKS = (64, 256, 1024, 4096)
# mixed steps as `chunked` builds them (its 512-token budget): a chunk over its request's
# earlier chunks (or a shared prefix) beside decodes of spread contexts, long ones included
CHUNKED_DECODES = (4, 16, 40, 64, 192)
CHUNKED_KV = (512, 2048, 8192, 16384)
CHUNKED_CHUNKS = (64, 256, 448)
CHUNKED_PREFIX = (0, 2048, 12288)
# mixed steps as prefix-heavy serving builds them (Mooncake conversations): a budget-filling chunk
# (512 tokens less the decodes) over a long prefix beside decodes of a log-normal spread of
# contexts, a few rows several times the mean (fit.skewed_lengths), around the decode count where
# flashinfer's fa2 plan switches its query tile (16 rows for a 512 budget): the spread pattern's
# evenly spaced rows put those steps 5-10% under the measured time
SKEWED_MIXED_DECODES = (8, 12, 16, 20, 24, 32)
SKEWED_MIXED_KV = (2048, 8192, 12288)
SKEWED_MIXED_PREFIX = (0, 4096, 12288, 24576)
SKEWED_MIXED_BUDGET = 512
# mixed steps as the fidelity runs' `chunked` cells served them: a budget-filling chunk beside
# decodes of a serving-like spread (fit.served_lengths), at decode counts that walk the fa2
# plan's mean packed query length through both tile switches (for a 512 budget and 2 query heads a
# KV head: 1024 / (decodes + 1)). The grid had 16 samples between 48 and 64 and none between 64
# and 96, where 4,600 served steps lie, priced a median 6.8% low (48-64: most of them the Mooncake
# cells' chunks over 6k-token prefixes, which the skewed family above covers) and 1.1% high
# (64-80: ShareGPT's and Azure's short prefixes, which these cover): benchmarks/mixed_step_errors.py
SERVED_MIXED_DECODES = (2, 4, 6, 8, 10, 12, 13, 14, 15, 16, 17, 18, 20, 24, 32, 48, 64, 96)
SERVED_MIXED_KV = (512, 2048)
SERVED_MIXED_PREFIX = (0, 1024)
SERVED_MIXED_BUDGET = 512
SPREAD_KV = (512, 1024, 2048, 8192)
PADDED_KV = (512, 2048)  # a graph's fewest rows (most padding), uniform
SKEWED_KV = (1024, 4096)  # decode rows of a log-normal spread of contexts (fit.skewed_lengths)
# decode rows as serving batches have them, shuffled (fit.near_lengths, fit.served_lengths), at
# every graph size, full and with its fewest rows: their time is not that of a uniform batch of
# the same KV (decode_plan.py says why)
NEAR_KV = (512, 1280, 3072)
SERVED_KV = (768, 2048)
TAILED_KV = (768, 1536, 3072)  # one row of 4x beside near ones (fit.tailed_lengths): DecodePlan.tail's samples
HOST_POLICIES = ("chunked", "prefill_first", "decode_first")
# the serving host workloads: (requests per second, requests); a light one, mostly idle
# between requests (the steps after an idle gap), and a moderate one
SERVING_LOADS = ((2.0, 8), (8.0, 48))
# The share of a decode row's context laid out as generated tokens (interleaved across the
# batch, see synthetic_batch): about what ShareGPT and Azure conversations have (outputs
# 17-21% of prompt + output). On the H200 the share does not change a decode step's time: 0-80%
# interleaved within 0.8% at batch 16-256 (benchmarks/exp_kv_layout.py, results/engine/README.md).
DECODE_INTERLEAVE = 0.2


def decode_sizes(graph_sizes: list[int], max_running: int) -> list[int]:
    """Every CUDA-graph size, and eager sizes above the largest graph (or, without graphs, a
    ladder up to max_running)."""
    if graph_sizes:
        top = graph_sizes[-1]
        eager = sorted({b for b in (top + 1, (top + max_running) // 2, max_running) if top < b <= max_running})
        return list(graph_sizes) + eager
    return sorted({b for b in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512) if b <= max_running}
                  | {max_running})


class Shape(NamedTuple):
    kind: str  # decode | prefill | mixed (one fresh chunk and decodes)
    extend: list[int]
    cached: list[int]
    pattern: str  # uniform, a fit.PATTERNS pattern (decode rows of unequal contexts around base + 1), or batch
    base: int  # the decode rows' cached length (uniform), or the one they spread around


def device_grid(max_tokens: int, max_running: int, graph_sizes: list[int], max_kv: int,
                quick: bool = False, base_tokens=(), batches=()) -> list[Shape]:
    """Every profiled shape. quick: a small grid (tests on the CPU). base_tokens: more token
    counts of one fresh prompt, the eager base curve's points (the piecewise graphs' sizes:
    an eager step's time steps up with its padded size, and a chord over PREFILL_TOKENS alone
    was up to 7% high between them). batches: mixed batches as the policies serve them
    ((extend, cached) rows, testbed/fidelity/served_batches.py), those within the limits."""
    shapes = []
    kvs = DECODE_KV[:2] if quick else DECODE_KV
    for b in decode_sizes(graph_sizes, max_running)[: 3 if quick else None]:
        for L in kvs:
            if b * L <= max_kv:
                shapes.append(Shape("decode", [1] * b, [L - 1] * b, "uniform", L - 1))
        for L in SPREAD_KV[:1] if quick else SPREAD_KV:
            if b > 1 and 2 * b * L <= max_kv:
                shapes.append(Shape("decode", [1] * b, (spread_lengths(L, b) - 1).tolist(), "spread", L - 1))
            if b in graph_sizes and graph_sizes.index(b) > 0 and not quick and L in PADDED_KV:
                least = graph_sizes[graph_sizes.index(b) - 1] + 1  # the fewest rows this graph runs: most padding
                if least * L <= max_kv:
                    shapes.append(Shape("decode", [1] * least, [L - 1] * least, "uniform", L - 1))
        for L in () if quick else SKEWED_KV:
            lengths = skewed_lengths(L, b)
            if b > 1 and b * int(lengths.max()) <= max_kv:
                shapes.append(Shape("decode", [1] * b, (lengths - 1).tolist(), "skewed", L - 1))
        if b in graph_sizes and b > 1 and not quick:
            least = graph_sizes[graph_sizes.index(b) - 1] + 1 if graph_sizes.index(b) > 0 else b
            for pattern, kvs in (("near", NEAR_KV), ("served", SERVED_KV), ("tailed", TAILED_KV)):
                for L in kvs:
                    for rows in sorted({b, max(least, 2)}):
                        lengths = PATTERNS[pattern](L, rows)
                        if int(lengths.sum()) * 2 <= max_kv:
                            shapes.append(Shape("decode", [1] * rows, (lengths - 1).tolist(), pattern, L - 1))
    toks = [t for t in PREFILL_TOKENS if t <= max_tokens] or [max_tokens]
    for n in toks[:3] if quick else toks:
        for c in PREFILL_CACHED[:2] if quick else PREFILL_CACHED:
            for k in PREFILL_REQS[:2] if quick else PREFILL_REQS:
                if k <= n and k <= max_running and k * (c + n // k) <= max_kv:
                    shapes.append(Shape("prefill", [n // k] * k, [c] * k, "uniform", c))
    for n in () if quick else sorted(set(base_tokens) - set(toks)):
        if n <= max_tokens:
            shapes.append(Shape("prefill", [n], [0], "uniform", 0))
    for d in MIXED_DECODES[:1] if quick else MIXED_DECODES:
        d = min(d, max_running - 1)
        for L in MIXED_KV[:1] if quick else MIXED_KV:
            for n in MIXED_CHUNKS[:2] if quick else MIXED_CHUNKS:
                if d > 0 and n <= max_tokens and 2 * d * L + n <= max_kv:
                    shapes.append(Shape("mixed", [n] + [1] * d, [0] + [L - 1] * d, "uniform", L - 1))
                    if d > 1:
                        shapes.append(Shape("mixed", [n] + [1] * d, [0] + (spread_lengths(L, d) - 1).tolist(), "spread",
                                            L - 1))
    if not quick:
        for d in CHUNKED_DECODES:
            for L in CHUNKED_KV:
                for n in CHUNKED_CHUNKS:
                    for pre in CHUNKED_PREFIX:
                        if d < max_running and n <= max_tokens and 2 * d * L + n + pre <= max_kv:
                            shapes.append(Shape("mixed", [n] + [1] * d, [pre] + (spread_lengths(L, d) - 1).tolist(),
                                                "spread", L - 1))
        # budget-filling chunks beside decodes: the skewed family (long prefixes), then the served one
        for pattern, decodes, kvs, prefixes, budget in (
                ("skewed", SKEWED_MIXED_DECODES, SKEWED_MIXED_KV, SKEWED_MIXED_PREFIX, SKEWED_MIXED_BUDGET),
                ("served", SERVED_MIXED_DECODES, SERVED_MIXED_KV, SERVED_MIXED_PREFIX, SERVED_MIXED_BUDGET)):
            for d in decodes:
                n = budget - d
                for L in kvs:
                    lengths = PATTERNS[pattern](L, d)
                    for pre in prefixes:
                        if d < max_running and n <= max_tokens and 2 * int(lengths.sum()) + n + pre <= max_kv:
                            shapes.append(Shape("mixed", [n] + [1] * d, [pre] + (lengths - 1).tolist(), pattern, L - 1))
    for e, c in batches:
        e, c = [int(x) for x in e], [int(x) for x in c]
        if len(e) <= max_running and sum(e) <= max_tokens and sum(e) + sum(c) <= max_kv:
            shapes.append(Shape("mixed", e, c, "batch", max(c)))
    return shapes


def shape_record(sh: Shape) -> dict:
    """What a profile stores of a shape (fit.sample_batch gives the shape back)."""
    return {"kind": sh.kind, "pattern": sh.pattern, "reqs": len(sh.extend), "tokens": int(sum(sh.extend)),
            "kv_tokens": int(sum(sh.extend) + sum(sh.cached)), "extend": sh.extend[0], "cached": sh.base,
            **({"chunk_cached": sh.cached[0]} if sh.kind == "mixed" else {}),
            **({"extend_lens": list(sh.extend), "cached_lens": list(sh.cached)} if sh.pattern == "batch" else {})}


def _sleep_cycles_per_s(device) -> float:
    """torch.cuda._sleep's cycles per second on this GPU, measured once."""
    torch.cuda.synchronize(device)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / (a.elapsed_time(b) / 1e3)


def time_shape(executor, ext, cac, num_slots: int, page_size: int, vocab: int, repeats: int,
               cycles_per_s: float | None) -> dict:
    """Medians of one shape: device idle at launch (free), then device held (device). Its
    decode rows' ids are gathered from the last tokens on the device, as in serving (a step
    launched before the last one's tokens are on the host): the gather's kernels are in every
    served decode step's time (profiles before it priced served small-graph decode steps
    ~1-2% short, 17-35 us at Qwen3-0.6B's graphs of 1-32 rows)."""
    hb = synthetic_host_batch(ext, cac, num_slots, page_size, vocab, interleave=DECODE_INTERLEAVE, pending=True)
    return time_host_batch(executor, hb, repeats, cycles_per_s)


def time_host_batch(executor, hb, repeats: int, cycles_per_s: float | None) -> dict:
    """time_shape of a prepared batch (its KV slots as they are)."""
    sampling = greedy_sampling(hb.fb.batch_size)
    prep, launch, free = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        h = executor.launch_host(hb, sampling)
        t1 = time.perf_counter()
        res = executor.collect(h)
        prep.append(h.prep_s)
        launch.append(t1 - t0 - h.prep_s)
        free.append(res.duration)
    device = free
    if cycles_per_s is not None:  # hold the device until the whole step is enqueued
        hold = 2.0 * float(np.median(np.add(prep, launch))) + 2e-3
        device = []
        for _ in range(repeats):
            torch.cuda._sleep(int(hold * cycles_per_s))
            device.append(executor.collect(executor.launch_host(hb, sampling)).duration)
    return {"prep_s": float(np.median(prep)), "launch_s": float(np.median(launch)),
            "free_s": float(np.median(free)), "device_s": float(np.median(device))}


def host_workload(n: int, vocab: int, max_context: int, seed: int) -> list[Request]:
    """n requests arriving 2 ms apart, prompts of 32-1024 tokens, outputs from 8 to 8 + 2n
    (the decode batch goes from n down to 1 as they finish one after another)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(32, 1025))
        o = 8 + 2 * i
        if p + o > max_context:
            p = max(1, max_context - o)
        ids = rng.integers(0, vocab, p, dtype=np.int64).astype(np.int32)
        out.append(Request(rid=i, prompt_len=p, max_new_tokens=o, arrival=0.002 * i, prompt_ids=ids,
                           ignore_eos=True, sampling=SamplingParams(0.0, -1, 1.0, seed=i)))
    return out


def run_host_workloads(s, spec, parts, schedulers, policies, n: int, serving: bool = True,
                       quick: bool = False) -> list[dict]:
    """Each policy's workloads through the real step loop; one row per step: the batch
    workload (host_workload) and, with `serving`, Poisson arrivals at two loads
    (serving_workload), which also give the steps launched after the engine sat idle
    (``idle_s``: the time between the previous step's result applied and this step's start).
    quick: the batch workload only (tests on the CPU, where a step takes a second).
    s: the EngineSettings; schedulers: (policy name, num_pages) -> a scheduler of that policy."""
    from testbed.engine.driver import RealtimeDriver
    from testbed.engine.executor import EngineExecutor

    rows = []
    for name in policies:
        loads = [("batch", host_workload(min(n, s.max_running), spec.vocab_size, spec.max_context,
                                         seed=len(rows)))]
        if serving and not quick:
            loads += [(f"serving_{rate:g}", serving_workload(count, rate, spec.vocab_size, spec.max_context,
                                                             seed=len(rows) + k))
                      for k, (rate, count) in enumerate(SERVING_LOADS)]
        for workload, reqs in loads:
            sched = schedulers(name, parts.slots // s.page_size)
            ex = EngineExecutor(parts.model, parts.device, s.max_running, sched, None, parts.graphs, parts.pieces)
            driver = RealtimeDriver(sched, ex, reqs, overlap=s.overlap)
            gc.collect()
            gc.freeze()
            driver.run()
            gc.unfreeze()
            if sched.check_integrity()["in_use"]:
                raise AssertionError(f"profiler workload ({name}, {workload}) leaked KV pages")
            cols = driver.steps.cols
            idle = idle_before(cols["start_s"], cols["end_s"], cols["complete_s"])
            keep = ("batch_reqs", "prefill_reqs", "prefill_tokens", "decode_reqs", "decode_tokens", "context_tokens",
                    "host_s", "launch_s", "complete_s", "duration_s", "running", "waiting")
            for i in range(1, len(driver.steps)):  # the first step pays first-use costs
                rows.append({"policy": name, "workload": workload, "idle_s": float(idle[i]),
                             **{k: cols[k][i] for k in keep}})
            log.info("host workload %s %s: %d steps", name, workload, len(driver.steps))
    return rows


def serving_workload(n: int, rate: float, vocab: int, max_context: int, seed: int) -> list[Request]:
    """n requests with Poisson arrivals at `rate` per second, prompts and outputs of
    conversation-like lengths (log-normal: prompts around 600 tokens, 16 to 4,096; outputs
    around 150, 8 to 1,024): the host as it runs in serving, idle gaps included."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    t -= t[0]
    out = []
    for i in range(n):
        p = int(np.clip(rng.lognormal(np.log(600), 0.9), 16, 4096))
        o = int(np.clip(rng.lognormal(np.log(150), 0.8), 8, 1024))
        if p + o > max_context:
            p = max(1, max_context - o)
        ids = rng.integers(0, vocab, p, dtype=np.int64).astype(np.int32)
        out.append(Request(rid=i, prompt_len=p, max_new_tokens=o, arrival=float(t[i]), prompt_ids=ids,
                           ignore_eos=True, sampling=SamplingParams(0.0, -1, 1.0, seed=i)))
    return out


def run_profile(s, spec, schedulers, repeats: int = 5, quick: bool = False, policies=HOST_POLICIES,
                host_requests: int | None = None, batches=()) -> dict:
    """Build the engine of EngineSettings `s` once (warmed up, whatever engine.warmup says:
    compilation must not land in the timings), time the device grid and the host workloads;
    schedulers: (policy name, num_pages) -> a scheduler of that policy; batches: served
    batches for the grid (device_grid)."""
    from testbed.engine.build import build_warm_parts
    from testbed.engine.executor import EngineExecutor

    if s.tp != 1:
        raise ValueError(f"engine.tp={s.tp}: the profiler runs one rank (engine.tp=1)")
    s = dataclasses.replace(s, warmup=True)
    t0 = time.perf_counter()
    parts = build_warm_parts(s, spec)
    device, slots, graphs = parts.device, parts.slots, parts.graphs
    sizes = list(graphs.sizes) if graphs is not None else []
    ex = EngineExecutor(parts.model, device, s.max_running, None, None, graphs, parts.pieces)
    cps = _sleep_cycles_per_s(device) if device.type == "cuda" else None
    pieces = list(parts.pieces.sizes) if parts.pieces is not None else []
    grid = device_grid(s.max_step_tokens, s.max_running, sizes, min(slots, 1 << 20), quick, pieces, batches)
    samples = []
    for sh in grid:
        m = time_shape(ex, sh.extend, sh.cached, slots, s.page_size, spec.vocab_size, repeats, cps)
        samples.append(shape_record(sh) | m)
    t_dev = time.perf_counter() - t0
    host = run_host_workloads(s, spec, parts, schedulers, policies, host_requests or s.max_running, quick=quick)
    return {
        "device_samples": samples, "host_samples": host, "graph_sizes": sizes, "num_pages": slots // s.page_size,
        "piece_sizes": pieces, "decode_plan": decode_plan(graphs, spec, s.page_size, device),
        "timing": {"device_grid_s": t_dev, "host_workloads_s": time.perf_counter() - t0 - t_dev,
                   "shapes": len(grid), "repeats": repeats, "decode_ids": "pending"},
        "machine": machine_info(device),
    }


def decode_plan(graphs, spec, page_size: int, device) -> dict | None:
    """flashinfer's split-KV plan of the CUDA-core decode kernel the graphs captured (the cost
    model's decode-graph load, sim/costmodel/decode_plan.py): the blocks one launch spreads over
    the SMs, its padded batch times the KV heads, as the smallest graph's plan reads. None where
    decode runs another kernel (tensor cores, torch) or the plan does not split."""
    if graphs is None or device.type != "cuda" or getattr(graphs.backend, "decode_tensor_cores", True):
        return None
    info = getattr(graphs.wrappers[graphs.sizes[0]], "_plan_info", None)
    if info is None or len(info) != 10 or not info[9]:  # DecodePlanInfo: padded batch first, split_kv last
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return {"grid": int(info[0]) * spec.num_kv_heads, "kv_heads": spec.num_kv_heads, "sms": sms,
            "min_chunk": max(128 // page_size, 1)}


def machine_info(device) -> dict:
    import platform
    info = {"host": platform.node(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(device)
        info |= {"gpu": prop.name, "gpu_memory_gib": round(prop.total_memory / 2**30, 1),
                 "gpu_sms": prop.multi_processor_count,
                 "cuda": torch.version.cuda, "driver": _driver_version()}
    for mod in ("flashinfer", "triton", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # not installed here: the profile says so
            info[mod] = None
    return info


def _cpu_model() -> str | None:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _driver_version() -> str | None:
    import subprocess
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
