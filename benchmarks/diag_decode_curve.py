"""How does a decode CUDA graph's device time grow with its rows' context? Times uniform
batches (every row the same context) on a fine ladder of contexts at a few graph sizes, full
and with the fewest rows the graph runs, and near-uniform ones (contexts spread +-20%), as
the profiler times a shape; and reads flashinfer's decode plan of each graph (its padded
batch: the grid it launches over the KV heads). Writes one row per shape.

    python benchmarks/diag_decode_curve.py model=qwen3_0_6b model.weights=dummy [--out FILE.json]
"""
from __future__ import annotations

import json
import sys

from diag_cell import pop_out

SIZES = (32, 64, 96, 128, 160)
CONTEXTS = (256, 512, 768, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 3072)


def main(argv):
    import numpy as np

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.profiler import DECODE_INTERLEAVE, _sleep_cycles_per_s, time_host_batch
    from testbed.engine.synthetic_batch import synthetic_host_batch

    out, argv = pop_out(argv)
    cfg = compose(["backend=engine"] + argv)
    spec = assemble.model_spec(cfg)
    parts = assemble.engine_parts(cfg)
    graphs = parts.graphs
    ex = EngineExecutor(parts.model, parts.device, cfg.scheduler.max_running, None, None, graphs, parts.pieces)
    cps = _sleep_cycles_per_s(parts.device)
    sizes = [s for s in SIZES if s in graphs.sizes]
    rows = []
    for s in sizes:
        below = max([g for g in graphs.sizes if g < s], default=0)
        for b in (s, below + 1):
            for L in CONTEXTS:
                for pattern in ("uniform", "near"):
                    if pattern == "near":
                        ctx = np.round(L * np.linspace(0.8, 1.2, b)).astype(np.int64)
                        ctx = np.random.default_rng(L + b).permutation(ctx)
                    else:
                        ctx = np.full(b, L, np.int64)
                    if int(ctx.sum()) * 1.3 > parts.slots:
                        continue
                    hb = synthetic_host_batch([1] * b, (ctx - 1).tolist(), parts.slots, cfg.engine.page_size,
                                              spec.vocab_size, interleave=DECODE_INTERLEAVE)
                    t = time_host_batch(ex, hb, 5, cps)["device_s"]
                    plan = getattr(graphs.wrappers[s], "_plan_info", None)
                    rows.append({"size": s, "rows": b, "context": L, "pattern": pattern,
                                 "kv_tokens": int(ctx.sum()), "device_s": t,
                                 "plan_info": [int(x) for x in plan] if plan is not None else None})
            r = [x for x in rows if x["size"] == s and x["rows"] == b and x["pattern"] == "uniform"]
            print(f"size {s} rows {b} plan {r[-1]['plan_info']}: " + ", ".join(
                f"{x['context']}:{x['device_s'] * 1e3:.3f}" for x in r), flush=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"model": cfg.model.name, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
