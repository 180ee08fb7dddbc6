"""Why do serving runs spend more host time per step than the profiler's host workloads? On one
model load: the profiler's host workload (chunked), a fidelity cell as planned, the same cell
with the roofline cost model (cheaper per-step predictions), the same cell with its requests
all at t=0, and the profiler's workload again. Median host / launch / complete ms of decode and
prefill steps per batch-size bin, one line per variant.

    python benchmarks/diag_host.py [cell=qwen3_0_6b-chunked-sharegpt-light] [--out FILE.json]
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from diag_cell import cell_engine, pop_out

BINS = [(1, 4), (5, 16), (17, 64), (65, 256)]


def medians(rows: list[dict]) -> dict:
    import numpy as np
    out = {}
    for kind in ("decode", "prefill"):
        for lo, hi in BINS:
            sel = [r for r in rows if (r["prefill_reqs"] == 0) == (kind == "decode") and lo <= r["batch_reqs"] <= hi]
            if len(sel) >= 5:
                out[f"{kind}_{lo}-{hi}"] = {k: round(1e3 * float(np.median([r[k] for r in sel])), 3)
                                            for k in ("host_s", "launch_s", "complete_s")} | {"n": len(sel)}
    return out


def main(argv):
    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.profiler import run_host_workloads
    from testbed.run import run

    out, argv = pop_out(argv)
    cell, cfg, spec, parts = cell_engine(argv, "qwen3_0_6b-chunked-sharegpt-light")
    res = {}

    def workload(tag):
        s = assemble.engine_settings(cfg, spec)
        res[tag] = medians(run_host_workloads(s, spec, parts, assemble.scheduler_per_policy(cfg, spec), ["chunked"],
                                              s.max_running))

    def cell_run(tag, extra):
        c = compose(cell.overrides + ["backend=engine"] + extra)
        with tempfile.TemporaryDirectory() as d:
            run(c, d, engine_parts=parts, keep_ids=False, print_table=False)
            import pandas as pd
            s = pd.read_parquet(Path(d) / "steps.parquet")
        res[tag] = medians(s.to_dict("records"))

    workload("profiler_workload")
    cell_run("cell", [])
    cell_run("cell_roofline", ["costmodel=roofline"])
    cell_run("cell_all_at_0", ["trace.rate=inf"])
    workload("profiler_workload_again")
    for tag, m in res.items():
        print(tag, json.dumps(m), flush=True)
    if out:
        out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
