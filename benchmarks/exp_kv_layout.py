"""Experiment (issue #17): how much a decode step's time depends on where its KV sits.

The engine's allocator hands a decoding request one page (page size 1: one token) a step, so the
tokens a request generates lie interleaved with those of the other rows of its batch (token j of
row i at tail + j * rows + i), while its prompt is one run of consecutive slots. The step
profiler lays out 20% of a decode row's context that way (profiler.DECODE_INTERLEAVE); the
engine benchmark's workload (outputs as long as prompts) has up to half. This script times
CUDA-graph decode steps as the profiler does (device time, median of repeats) for each batch
size and context with 0%, 20%, 50% and 80% of every row's context interleaved, so the gain a
request-contiguous layout would give is known before the allocator is changed. GPU only.

    python benchmarks/exp_kv_layout.py --model qwen3_0_6b --out FILE [--batches 16,64,128,256] [--contexts 600,1024]
        [--set KEY=VALUE ...]  # engine overrides (the test: --set engine.device=cpu ...)
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
    ap.add_argument("--batches", default="16,64,128,256")
    ap.add_argument("--contexts", default="600,1024")
    ap.add_argument("--interleave", default="0,0.2,0.5,0.8")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from probe_engine import probe_engine
    from testbed.engine.profiler import time_host_batch
    from testbed.engine.synthetic_batch import synthetic_host_batch

    spec, s, parts, ex, cps = probe_engine(a.model, a.set)
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        for ctx in [int(x) for x in a.contexts.split(",")]:
            for f in [float(x) for x in a.interleave.split(",")]:
                ext, cac = np.ones(b, np.int64), np.full(b, ctx - 1, np.int64)
                hb = synthetic_host_batch(ext, cac, parts.slots, s.page_size, spec.vocab_size, interleave=f,
                                          pending=True)
                t = time_host_batch(ex, hb, a.repeats, cps)
                rows.append({"batch": b, "context": ctx, "interleave": f, "device_s": t["device_s"]})
                print(f"batch {b:4d} context {ctx:5d} interleave {f:.1f}: {t['device_s'] * 1e3:.3f} ms", flush=True)
                Path(a.out).write_text(json.dumps({"model": a.model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
