"""Where the engine runs' host speed comes from (issue #11): for every engine run of a fidelity
experiment, each host part of a step (host_s: schedule, batch build, upload; launch_s; complete_s)
over the profile's host fit for the same step, the median over the run's decode and prefill-bearing
steps apart; then whether the run's host speed (the report's column) follows its load: Spearman
correlations against the median batch and against the device time over the host fit.

    python benchmarks/fidelity_host_speed.py [--out-dir benchmarks/results/fidelity] [--write FILE]

No GPU: reads the committed runs (DIR/runs/<cell>/r<k>/steps.parquet) and the plan's profiles."""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def run_parts(steps: pd.DataFrame, cost) -> dict:
    from testbed.fidelity.report import host_ratio  # the report's host-speed column, as it computes it
    p = cost.host_parts_arrays(steps["batch_reqs"], steps["prefill_tokens"] + steps["decode_tokens"],
                               steps["context_tokens"])
    dec = (steps["prefill_reqs"] == 0).to_numpy()

    def med(col: str, part: str, mask) -> float | None:
        return float(np.median(steps[col].to_numpy()[mask] / np.asarray(p[part])[mask])) if mask.any() else None

    fit_host = np.asarray(p["host_s"]) + np.asarray(p["launch_s"])
    return {"host_speed": host_ratio(steps, cost),
            "decode_host": med("host_s", "host_s", dec), "decode_launch": med("launch_s", "launch_s", dec),
            "decode_complete": med("complete_s", "complete_s", dec),
            "prefill_host": med("host_s", "host_s", ~dec), "prefill_launch": med("launch_s", "launch_s", ~dec),
            "median_batch": float(np.median(steps["batch_reqs"])),
            "device_over_host_fit": float(np.median(steps["duration_s"].to_numpy()
                                                    / (fit_host + np.asarray(p["complete_s"]))))}


def main() -> None:
    from testbed.fidelity.cells import read_plan
    from testbed.fidelity.report import cell_cost_model, engine_runs
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results" / "fidelity")
    ap.add_argument("--write", type=Path, default=None, help="JSON to write (default: print only)")
    a = ap.parse_args()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cost model's out-of-range notes
        for cell in read_plan(a.out_dir / "plan.json"):
            runs = engine_runs(a.out_dir, cell)
            if not runs:
                continue
            cost = cell_cost_model(runs[0], cell)
            for k, run in enumerate(runs, 1):
                rows.append({"cell": cell.name, "run": k, **run_parts(pd.read_parquet(run / "steps.parquet"), cost)})
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(df.round(2).to_string(index=False))
    corr = df[["host_speed", "median_batch", "device_over_host_fit"]].corr(method="spearman")
    parts = df[["decode_host", "decode_launch", "decode_complete", "prefill_host", "prefill_launch"]].corr(
        method="spearman")
    print("\nSpearman, host speed against load:\n" + corr.round(2).to_string())
    print("\nSpearman between the host parts:\n" + parts.round(2).to_string())
    if a.write:
        a.write.write_text(json.dumps({"runs": rows, "spearman_load": corr.round(3).to_dict(),
                                       "spearman_parts": parts.round(3).to_dict()}, indent=1) + "\n")
        print(f"wrote {a.write}")


if __name__ == "__main__":
    main()
