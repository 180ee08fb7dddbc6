"""Mixed steps (a prefill chunk beside decodes) priced by a profile against the fidelity runs'
steps and against the profile's own grid samples, binned by the fa2 plan's mean packed query
length (tokens x query heads per KV head over the batch's rows: what picks the kernel's query
tile, 16 / 64 / 128, fit.fa2_plan): where the served steps are and where the grid measured.

    python benchmarks/mixed_step_errors.py [--profile FILE] [--dirs DIR,DIR] [--model qwen3_0_6b] [--out FILE]

No GPU: the steps are rebuilt from the runs' files (testbed/fidelity/batches.py). --profile: a
profile file for every cell of the model and for the grid rows (default: the committed one,
for plans that name no other); --dirs: fidelity directories with plan.json and runs/ (default: the runs of
2026-12-01, same_start_1201/, and the report's, the eighth start's)."""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FID = ROOT / "benchmarks/results/fidelity"
BINS = (0, 8, 16, 24, 32, 48, 64, 80, 96, 128, 256, 10**6)


def packed_mean(extend, group: int) -> int:
    """flashinfer's avg_packed_qo_len: the rows' packed query lengths summed, over the rows (floor)."""
    e = np.asarray(extend, np.int64)
    return int((e * group).sum()) // len(e)


def served_rows(dirs, model: str, profile: str | None, group: int):
    from testbed.fidelity.batches import is_mixed, step_batches
    from testbed.fidelity.cells import read_plan
    from testbed.fidelity.report import cell_cost_model, engine_runs
    rows, cost = [], None
    for d in dirs:
        for cell in read_plan(d / "plan.json"):
            if cell.model != model:
                continue
            if profile is not None:
                cell.profile = profile
            elif cell.profile:  # the grid rows below are the committed profile's: one profile for both
                raise SystemExit(f"error: {d / 'plan.json'} names profile {cell.profile!r} for {cell.name}; "
                                 f"pass --profile FILE to price every cell and the grid by one profile")
            for run in engine_runs(d, cell):
                cost = cell_cost_model(run, cell)
                reqs, steps = pd.read_parquet(run / "requests.parquet"), pd.read_parquet(run / "steps.parquet")
                dur = steps["duration_s"].to_numpy()
                for i, b in enumerate(step_batches(reqs, steps)):
                    if b is None or not is_mixed(b[0]):
                        continue
                    rows.append({"source": "served", "avg": packed_mean(b[0], group),
                                 "decodes": int((b[0] == 1).sum()),
                                 "ratio": float(cost.device_time(*b)) / float(dur[i])})
    return rows, cost


def grid_rows(cost, prof: dict, group: int):
    from testbed.sim.costmodel.fit import sample_batch
    out = []
    for s in prof["samples"]["device"]:
        if s["kind"] != "mixed":
            continue
        e, c = map(np.asarray, sample_batch(s))
        out.append({"source": "grid", "avg": packed_mean(e, group), "decodes": int((e == 1).sum()),
                    "ratio": float(cost.device_time(e, c)) / s["device_s"]})
    return out


def table(rows) -> pd.DataFrame:
    d = pd.DataFrame(rows)
    d["avg_packed"] = pd.cut(d["avg"], BINS)
    g = d.groupby(["avg_packed", "source"], observed=True)["ratio"]
    t = g.agg(steps="size", median="median", p25=lambda x: x.quantile(0.25), p75=lambda x: x.quantile(0.75))
    t = t.reset_index()
    t["avg_packed"] = t["avg_packed"].astype(str)
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--dirs", default=f"{FID / 'same_start_1201'},{FID}")
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    dirs = [Path(p) for p in a.dirs.split(",")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cost model's out-of-range notes
        pfile = a.profile or ROOT / "testbed/sim/costmodel/profiles" / f"h200_{a.model}.json"
        prof = json.loads(pfile.read_text())
        group = prof["model"]["num_q_heads"] // prof["model"]["num_kv_heads"]  # one TP rank's heads alike
        rows, cost = served_rows(dirs, a.model, str(a.profile) if a.profile else None, group)
        if cost is None:
            raise SystemExit(f"error: no engine run of model {a.model!r} under {a.dirs}")
        rows += grid_rows(cost, prof, group)
    t = table(rows)
    pd.set_option("display.width", 160)
    print(f"mixed steps, predicted / measured device time by the fa2 plan's mean packed query length "
          f"(profile {pfile.name}; tile 16 up to 16, 64 up to 64, 128 above)")
    print(t.round(3).to_string(index=False))
    if a.out:
        a.out.write_text(json.dumps({"profile": str(pfile.relative_to(ROOT) if pfile.is_relative_to(ROOT) else pfile),
                                     "dirs": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in dirs],
                                     "bins": t.to_dict("records")}, indent=1) + "\n")
        print(f"written {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
