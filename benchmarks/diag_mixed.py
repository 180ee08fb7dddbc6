"""Why do a serving run's mixed steps take longer than the profile predicts? Runs a fidelity cell
on the engine, keeping every step's batch (extend and cached lengths) and measured time, then
re-times a sample of its mixed steps as the profiler does
(synthetic batch of the same shape, contiguous KV, device held busy until enqueued). Writes
one row per re-timed step.

    python benchmarks/diag_mixed.py [cell=qwen3_0_6b-chunked-sharegpt-high] [--sweep] [--out FILE.json]

--sweep also times one 512-token chunk over a 4k or 12k prefix beside 8 to 24 decode rows of
~8k contexts (spread as the profiler spreads them): where flashinfer's fa2 plan switches its
query tile from 128 to 64 rows (the mean packed query length falls to 64), the Mooncake cells'
mixed steps came out 6-11% over the cost model.
"""
from __future__ import annotations

import json
import sys

from diag_cell import cell_engine, pop_out


def torch_sms(device) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def main(argv):
    import numpy as np

    from testbed import assemble
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.profiler import _sleep_cycles_per_s, time_shape

    out, argv = pop_out(argv)
    do_sweep = "--sweep" in argv
    argv = [a for a in argv if a != "--sweep"]
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
    sweep = []
    if do_sweep:
        from testbed.sim.costmodel.fit import Fa2Shape, fa2_plan, spread_lengths
        fa = Fa2Shape(spec.num_q_heads // spec.num_kv_heads, spec.num_kv_heads,
                      torch_sms(parts.device), cfg.engine.page_size)
        for pre in (4096, 12288):
            for d in (8, 10, 12, 13, 14, 15, 16, 18, 20, 24):
                n = [512] + [1] * d
                c = [pre] + (spread_lengths(8192, d) - 1).tolist()
                m = time_shape(probe, n, c, parts.slots, cfg.engine.page_size, spec.vocab_size, 5, cps)
                sweep.append({"extend": n, "cached": c, "tile": fa2_plan(n, c, fa)[0], "device_s": m["device_s"]})
                print(f"sweep prefix {pre} decode rows {d}: tile {sweep[-1]['tile']}, {m['device_s'] * 1e3:.3f} ms")
    ratio = np.array([r["measured_s"] / r["synthetic_device_s"] for r in rows])
    print(f"{name}: {len(shapes)} steps, {len(mixed)} mixed; re-timed {len(rows)}: measured / synthetic "
          f"median {np.median(ratio):.3f}, p10 {np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f}")
    if out:
        out.write_text(json.dumps({"cell": name, "rows": rows, "sweep": sweep}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
