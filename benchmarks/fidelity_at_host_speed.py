"""The fidelity matrix replayed with each cell's host speed as measured in its engine runs
(the report's host-speed column, mean of the two runs, as `costmodel.host_scale`): how much of
the simulator's error the host's speed explains. A diagnostic, not the calibration: the speed
comes from the very runs the simulator is judged against.

    python benchmarks/fidelity_at_host_speed.py [--dir benchmarks/results/fidelity] [--out DIR/at_host_speed.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FID = ROOT / "benchmarks/results/fidelity"


def main(argv=None) -> int:
    from testbed.config import compose
    from testbed.fidelity.cells import read_plan
    from testbed.fidelity.compare import HEADLINE, cell_errors
    from testbed.fidelity.report import engine_runs, sim_overrides
    from testbed.run import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=FID, help="a fidelity directory with its report (fidelity.json)")
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default DIR/at_host_speed.json)")
    a = ap.parse_args(argv)
    committed = json.loads((a.dir / "fidelity.json").read_text())["cells"]
    rows = {}
    for cell in read_plan(a.dir / "plan.json"):
        runs = [json.loads((p / "summary.json").read_text()) for p in engine_runs(a.dir, cell)]
        speed = float(np.mean(committed[cell.name]["host_ratio"]))
        with tempfile.TemporaryDirectory() as d:
            s = run(compose(sim_overrides(cell, runs[0]) + [f"costmodel.host_scale={speed}"]), f"{d}/sim",
                    print_table=False)
        e = cell_errors([r["metrics"] for r in runs], s["metrics"])
        rows[cell.name] = {"host_scale": speed, **{k: e[k]["error"] for k in HEADLINE}}
        print(cell.name, f"host x{speed:.2f}", " ".join(f"{e[k]['error']:+.1%}" for k in HEADLINE), flush=True)
    err = np.abs([[r[k] for k in HEADLINE] for r in rows.values()])
    summary = {"cells_within_5pct_on_all": int((err.max(1) <= 0.05).sum()), "cells": len(rows),
               "median_abs_error": dict(zip(HEADLINE, map(float, np.median(err, 0)))),
               "worst": float(err.max())}
    (a.out or a.dir / "at_host_speed.json").write_text(json.dumps({"summary": summary, "cells": rows}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
