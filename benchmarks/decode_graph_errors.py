"""Each profile's device time against the committed fidelity runs' steps, per step kind and, for
decode graphs, per captured size: the median of predicted / measured. No GPU: the steps are
rebuilt from the runs' files (testbed/fidelity/batches.py).

    python benchmarks/decode_graph_errors.py PROFILE.json [PROFILE.json ...] [--model qwen3_0_6b] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    import numpy as np
    import pandas as pd

    from testbed import assemble
    from testbed.fidelity.batches import step_batches
    from testbed.fidelity.cells import read_plan
    from testbed.fidelity.report import engine_runs

    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    out = ROOT / "benchmarks/results/fidelity"
    batches = []  # (extend, cached, measured s) of every step of every run of the model's cells
    for cell in read_plan(out / "plan.json"):
        if cell.model != a.model:
            continue
        for run in engine_runs(out, cell):
            reqs, steps = pd.read_parquet(run / "requests.parquet"), pd.read_parquet(run / "steps.parquet")
            dur = steps["duration_s"].to_numpy()
            batches += [(b[0], b[1], dur[i]) for i, b in enumerate(step_batches(reqs, steps)) if b is not None
                        and len(b[0])]
    result = {}
    for path in a.profiles:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cost = assemble.profile_cost_model(path, a.model, "h200")
            rows = []
            for e, c, meas in batches:
                graph = bool((e == 1).all()) and cost.is_graph(e)
                kind = "prefill" if not (e == 1).any() else "mixed" if (e > 1).any() else (
                    "decode_graph" if graph else "decode_eager")
                size = int(cost.sizes[np.searchsorted(cost.sizes, len(e))]) if graph else 0
                rows.append((kind, size, cost.device_time(e, c) / meas))
        d = pd.DataFrame(rows, columns=["kind", "size", "ratio"])
        by_kind = d.groupby("kind")["ratio"].agg(["size", "median"])
        by_size = d[d.kind == "decode_graph"].groupby("size")["ratio"].agg(["size", "median"])
        result[str(path)] = {"kind": by_kind.to_dict(orient="index"), "graph_size": by_size.to_dict(orient="index")}
        print(f"{path}: predicted / measured device time, median")
        print("  " + ", ".join(f"{k} {v['median']:.3f} ({v['size']})" for k, v in result[str(path)]["kind"].items()))
        print("  decode graph by size: " + ", ".join(f"{k}: {v['median']:.3f}" for k, v in
                                                      result[str(path)]["graph_size"].items()))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
