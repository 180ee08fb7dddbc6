"""Fidelity cells re-run on another machine start, against the simulator and the committed
runs: how far the committed profile carries beyond the start it was measured on.

On a GPU, into DIR (with the committed plan.json copied there):

    python -m testbed.fidelity engine out=DIR repeats=1 cells=A,B,...

then, anywhere (the simulator side of those cells, then this comparison):

    python -m testbed.fidelity report out=DIR cells=A,B,...
    python benchmarks/fidelity_another_start.py DIR [--out benchmarks/results/fidelity/another_start_h200.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FID = ROOT / "benchmarks/results/fidelity"


def main(argv=None) -> int:
    from testbed.fidelity.compare import HEADLINE

    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path, help="the other start's fidelity directory (after its report)")
    ap.add_argument("--out", type=Path, default=FID / "another_start_h200.json")
    a = ap.parse_args(argv)
    other = json.loads((a.dir / "fidelity.json").read_text())["cells"]
    committed = json.loads((FID / "fidelity.json").read_text())["cells"]
    cells = {}
    for name, c in other.items():
        m = committed[name]
        row = {k: {"this_start": c["errors"][k]["engine"][0], "committed_runs": m["errors"][k]["engine"],
                   "sim": c["errors"][k]["sim"], "sim_error_vs_this_start": c["errors"][k]["error"],
                   "sim_error_vs_committed": m["errors"][k]["error"]} for k in HEADLINE}
        row["host_speed"] = {"this_start": (c.get("host_ratio") or [None])[0], "committed_runs": m.get("host_ratio")}
        cells[name] = row

    def summary(key: str) -> dict:
        errs = {k: [abs(r[k][key]) for r in cells.values()] for k in HEADLINE}
        return {"within_5pct_on_all": sum(all(abs(r[k][key]) <= 0.05 for k in HEADLINE) for r in cells.values()),
                "cells_within_5pct": {k: sum(e <= 0.05 for e in v) for k, v in errs.items()},
                "median_abs_error": {k: round(float(np.median(v)), 4) for k, v in errs.items()}}
    machine = json.loads((a.dir / "runs" / "machine.json").read_text())
    out = {"what": f"{len(cells)} fidelity cells re-run on the engine on another machine start than the committed "
                   "runs', against the simulator with the committed profiles",
           "machine_start": machine.get("date"), "cells_run": sorted(cells),
           "summary": {"cells": len(cells), "this_start": summary("sim_error_vs_this_start"),
                       "committed_runs_same_cells": summary("sim_error_vs_committed")},
           "cells": cells}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    s = out["summary"]
    print(f"{len(cells)} cells: within 5% on all {len(HEADLINE)} metrics on this start "
          f"{s['this_start']['within_5pct_on_all']}, against the committed runs "
          f"{s['committed_runs_same_cells']['within_5pct_on_all']}; written {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
