"""Experiment (issue #11): where a split-KV decode graph's time goes, by context pattern.

The fit prices Qwen3-0.6B's decode graphs of 112-144 rows by pattern +5-8% (near-equal contexts)
to -6-14% (spread or skewed ones), on the profile's own samples
(benchmarks/results/fidelity/experiments/README.md). This script builds the engine as the
profiler does and times, for each pattern at each size, one CUDA-graph decode step as the
profiler times it (the step's device time, median of repeats), then replays it under the torch
profiler and sums each kernel's time in the step, so that the attention kernel and the split
rows' merge can be set against the emulated plan's load (testbed/sim/costmodel/decode_plan.py).
Writes one JSON (GPU only).

    python benchmarks/exp_split_kv_kernels.py --out FILE [--sizes 96,128,144,160] [--context 1500] [--shuffle SEED]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--sizes", default="96,128,144,160")
    ap.add_argument("--context", type=int, default=1500, help="the patterns' mean context")
    ap.add_argument("--patterns", default="uniform,near,served,spread,skewed")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shuffle", type=int, default=None,
                    help="permute each batch's rows with this seed: the plan's chunk and the KV stay, "
                         "the blocks' placement on the SMs moves")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from probe_engine import probe_engine
    from testbed.engine.profiler import DECODE_INTERLEAVE, decode_plan, time_host_batch
    from testbed.engine.synthetic_batch import greedy_sampling, synthetic_host_batch
    from testbed.sim.costmodel.decode_plan import DecodePlan
    from testbed.sim.costmodel.fit import PATTERNS, graph_lengths

    spec, s, parts, ex, cps = probe_engine(a.model)
    plan_info = decode_plan(parts.graphs, spec, s.page_size, parts.device)
    plan = DecodePlan(**plan_info)
    rows = []
    for size in [int(x) for x in a.sizes.split(",")]:
        for pat in a.patterns.split(","):
            ctx = np.full(size, a.context, np.int64) if pat == "uniform" else PATTERNS[pat](a.context, size)
            if a.shuffle is not None:
                ctx = np.random.default_rng(a.shuffle).permutation(ctx)
            ext, cac = np.ones(size, np.int64), ctx - 1
            hb = synthetic_host_batch(ext, cac, parts.slots, s.page_size, spec.vocab_size,
                                      interleave=DECODE_INTERLEAVE, pending=True)
            timed = time_host_batch(ex, hb, a.repeats, cps)
            sampling = greedy_sampling(hb.fb.batch_size)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    ex.collect(ex.launch_host(hb, sampling))
                torch.cuda.synchronize()
            kernels: dict[str, float] = {}
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
                if t:
                    kernels[e.key] = t / 3 / 1e6  # seconds a step
            lens = graph_lengths(ext, cac, size)
            row = {"size": size, "pattern": pat, "shuffle": a.shuffle, "kv": int(ctx.sum()), "longest": int(ctx.max()),
                   "plan_load": plan.load(lens), "device_s": timed["device_s"], "free_s": timed["free_s"],
                   "kernels_s": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])}
            rows.append(row)
            top = ", ".join(f"{k[:40]} {v * 1e6:.0f}us" for k, v in list(row["kernels_s"].items())[:4])
            print(f"size {size} {pat:8s} kv {row['kv']:7d} device {timed['device_s'] * 1e3:.3f} ms  "
                  f"load {row['plan_load']:.0f}  {top}", flush=True)
            Path(a.out).write_text(json.dumps({"plan": plan_info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
