"""An engine run set's served steps as measured device samples, in the file `python -m
testbed.profile refit=P local_from=F graph_samples_from=F` takes: the mixed steps for the local
correction (local_from), the CUDA-graph decode steps for the graph fit (graph_samples_from).

A profile's grid lays out its shapes as patterns of contexts; the steps a run serves differ (a
decode graph of 160 rows with a few conversations 3-4x the mean context: priced 0.96 of its time
on every H200 start, `python benchmarks/decode_step_drift.py`). The steps of another machine
start's runs, each with its measured device time, are measured shapes as served. Steps launched
after the host sat idle (the profile's wake gap) are left out: their device time holds the wake.

    python benchmarks/runs_as_samples.py --dir RUNS_DIR [--dir ...] --profile P --out F
        [--model qwen3_0_6b] [--kinds mixed,graph] [--graph-per-size 24] [--min-rows 33]

The run set's plan.json names its cells; every run of `--model`'s cells is read. Decode-graph
steps are thinned per graph size to `--graph-per-size` (stratified over the longest row over the
mean context, then KV tokens: each cell's median member by device time per KV token), so that a few thousand served
steps do not outweigh the grid's dozen shapes a size in the fit; graphs of fewer than
`--min-rows` rows are left out (their served steps are priced within about 1%). Mixed steps are
kept whole (the local correction weighs its nearest shapes). The file records the profile's
model and engine and the runs' machine."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def served_steps(d: Path, model: str, min_rows: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(mixed samples, decode-graph samples with their graph size and longest row over the mean,
    machine records) of a run set."""
    from testbed.engine.profiler import Shape, shape_record
    from testbed.fidelity.batches import is_mixed, woken
    from testbed.fidelity.report import priced_runs
    mixed, graphs, machines = [], [], []
    for m in sorted(d.glob("runs/**/machine.json")):
        machines.append(json.loads(m.read_text()))
    for cost, steps, batches, _ in priced_runs(d, model):
        woken_at = woken(steps, cost)
        dur = steps["duration_s"].to_numpy()
        for i, b in enumerate(batches):
            if b is None or not len(b[0]) or woken_at[i]:
                continue
            e, c = (x.astype(int).tolist() for x in b)
            if is_mixed(b[0]):
                sh = Shape("mixed", e, c, "batch", max(c))
                mixed.append(shape_record(sh) | {"device_s": float(dur[i])})
            elif cost.is_graph(b[0]) and len(e) >= min_rows:
                sh = Shape("decode", e, c, "batch", max(c))
                ctx = b[0] + b[1]
                graphs.append(shape_record(sh) | {"device_s": float(dur[i]),
                                                  "_size": int(cost.sizes[np.searchsorted(cost.sizes, len(e))]),
                                                  "_longest": float(ctx.max() / ctx.mean())})
    return mixed, graphs, machines


def thin(graphs: list[dict], per_size: int) -> list[dict]:
    """Per graph size at most per_size steps: strata of the longest row over the mean (under 2,
    2-3, 3-4, beyond), each given its share of per_size, split further by KV tokens; from each
    cell the step whose device time per KV token is its median (measured figures only: the choice
    does not move when the graph fit of the profile that reads the runs does)."""
    out = []
    for size in sorted({g["_size"] for g in graphs}):
        at = [g for g in graphs if g["_size"] == size]
        strata = [[g for g in at if lo <= g["_longest"] < hi] for lo, hi in ((0, 2), (2, 3), (3, 4), (4, np.inf))]
        strata = [s for s in strata if s]
        for s in strata:
            k = max(1, min(len(s), round(per_size * len(s) / len(at))))
            s = sorted(s, key=lambda g: g["kv_tokens"])
            for part in np.array_split(np.arange(len(s)), k):
                cell = sorted((s[j] for j in part), key=lambda g: g["device_s"] / g["kv_tokens"])
                out.append(cell[len(cell) // 2])
    return [{k: v for k, v in g.items() if not k.startswith("_")} for g in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, action="append", required=True)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--graph-per-size", type=int, default=24)
    ap.add_argument("--min-rows", type=int, default=33)
    ap.add_argument("--kinds", default="mixed,graph", help="which steps to write: mixed, graph or both")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    kinds = set(a.kinds.split(","))
    if not kinds or kinds - {"mixed", "graph"}:
        ap.error(f"--kinds {a.kinds!r}: allowed: mixed, graph or mixed,graph")
    warnings.filterwarnings("ignore", message=".*beyond the profiled range.*")
    prof = json.loads(a.profile.read_text())
    mixed, graphs, machines = [], [], []
    for d in a.dir:
        m, g, mm = served_steps(d, a.model, a.min_rows)
        mixed, graphs, machines = mixed + m, graphs + g, machines + mm
    if not mixed and not graphs:
        raise SystemExit(f"error: no served steps of model {a.model!r} in {', '.join(map(str, a.dir))}")
    mixed = mixed if "mixed" in kinds else []
    kept = thin(graphs, a.graph_per_size) if "graph" in kinds else []
    machine = machines[0] if machines else {}
    a.out.write_text(json.dumps({"model": prof["model"], "hardware": prof["hardware"], "engine": prof["engine"],
                                 "machine": machine, "source": [str(d) for d in a.dir],
                                 "samples": {"device": mixed + kept}}) + "\n")
    print(f"{len(mixed)} mixed and {len(kept)} of {len(graphs) if 'graph' in kinds else 0} decode-graph steps "
          f"written to {a.out}")


if __name__ == "__main__":
    main()
