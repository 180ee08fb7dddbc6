"""Why do a serving run's mixed steps take longer than the profile predicts? Runs a fidelity cell
on the engine, keeping every step's batch (extend and cached lengths) and measured time, then
re-times a sample of its mixed steps as the profiler does
(synthetic batch of the same shape, contiguous KV, device held busy until enqueued). Writes
one row per re-timed step.

    python benchmarks/diag_mixed.py [cell=qwen3_0_6b-chunked-sharegpt-high] [--out FILE.json]
"""
from __future__ import annotations

import json
import sys

from diag_cell import cell_engine, pop_out


def main(argv):
    import numpy as np

    from testbed import assemble
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.profiler import _sleep_cycles_per_s, time_shape

    out, argv = pop_out(argv)
    cell, cfg, spec, parts = cell_engine(argv, "qwen3_0_6b-chunked-sharegpt-high")
    name = cell.name
    built = assemble.build_run(cfg, parts)
    driver = built.driver
    # every launched step's batch, as the executor keeps it for its after-the-run predictions
    shapes = driver.executor.predictions.shapes
    import gc
    gc.collect()
    gc.freeze()
    driver.run()
    gc.unfreeze()
    dur = np.array(driver.steps.cols["duration_s"], float)
    mixed = [i for i, (n, c) in enumerate(shapes) if (n > 1).any() and (n == 1).any()]
    rng = np.random.default_rng(0)
    pick = sorted(set(rng.choice(mixed, size=min(60, len(mixed)), replace=False).tolist()))
    probe = EngineExecutor(parts.model, parts.device, cfg.scheduler.max_running, None, None, parts.graphs, parts.pieces)
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
