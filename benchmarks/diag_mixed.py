"""Why do a serving run's mixed steps take longer than the profile predicts? Runs a fidelity cell
on the engine recording every step's batch (extend and cached lengths, how scattered its KV
slots are) and measured time, then re-times a sample of its mixed steps as the profiler does
(synthetic batch of the same shape, contiguous KV, device held busy until enqueued). Writes
one row per re-timed step.

    python benchmarks/diag_mixed.py [cell=qwen3_0_6b-chunked-sharegpt-high] [--out FILE.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv):
    import numpy as np

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.build import build_engine, build_parts
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.profiler import _sleep_cycles_per_s, time_shape
    from testbed.fidelity.cells import read_plan

    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out, argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    name = dict(a.split("=", 1) for a in argv).get("cell", "qwen3_0_6b-chunked-sharegpt-high")
    cell = next(c for c in read_plan(Path(__file__).resolve().parents[1] / "benchmarks/results/fidelity/plan.json")
                if c.name == name)
    cfg = compose(cell.overrides + ["backend=engine"])
    spec = assemble.model_spec(cfg)
    parts = build_parts(cfg, spec)
    trace = assemble.trace_for(cfg, spec)
    requests = assemble.requests_from(trace, spec, cfg.engine)
    driver, sched, _ = build_engine(cfg, spec, requests, parts)
    ex = driver.executor
    shapes = []
    launch = ex.launch

    def recording_launch(plan):  # the batch as the engine runs it, and its slots' layout
        h = launch(plan)
        shapes.append((plan.extend_lens.copy(), plan.cached_lens.copy()))
        return h
    ex.launch = recording_launch
    import gc
    gc.collect()
    gc.freeze()
    driver.run()
    gc.unfreeze()
    dur = np.array(driver.steps.cols["duration_s"], float)
    mixed = [i for i, (n, c) in enumerate(shapes) if (n > 1).any() and (n == 1).any()]
    rng = np.random.default_rng(0)
    pick = sorted(set(rng.choice(mixed, size=min(60, len(mixed)), replace=False).tolist()))
    probe = EngineExecutor(parts.model, parts.device, cfg.policy.max_running, None, None, parts.graphs, parts.pieces)
    cps = _sleep_cycles_per_s(parts.device)
    rows = []
    for i in pick:
        n, c = shapes[i]
        m = time_shape(probe, n.tolist(), c.tolist(), parts.slots, cfg.engine.page_size, spec.vocab_size, 3, cps)
        rows.append({"step": i, "extend": n.tolist(), "cached": c.tolist(), "measured_s": float(dur[i]),
                     "synthetic_device_s": m["device_s"], "synthetic_free_s": m["free_s"]})
    ratio = np.array([r["measured_s"] / r["synthetic_device_s"] for r in rows])
    print(f"{name}: {len(shapes)} steps, {len(mixed)} mixed; re-timed {len(rows)}: measured / synthetic "
          f"median {np.median(ratio):.3f}, p10 {np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f}")
    if out:
        out.write_text(json.dumps({"cell": name, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
