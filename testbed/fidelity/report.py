"""Replay the engine runs of a fidelity directory in the simulator and write the report:
report.md (the error table, the engine's spread, step times), fidelity.json (every figure)
and CDF plots of TTFT / TPOT / E2E per model and trace."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from testbed.fidelity.batches import device_error_table, step_batches, step_device_errors
from testbed.fidelity.compare import HEADLINE, METRICS, cell_errors, label, step_table
from testbed.fidelity.misses import BAR, misses_section

REPO = Path(__file__).resolve().parents[2]


def engine_runs(out: Path, cell) -> list[Path]:
    return sorted(p for p in (out / "runs" / cell.name).glob("r*") if (p / "summary.json").is_file())


def sim_overrides(cell, engine_summary: dict) -> list[str]:
    """The cell as the simulator replays it: the engine's KV pool size, the calibrated profile."""
    from testbed.fidelity.cells import simulator_overrides
    return simulator_overrides(cell.overrides, cell.profile) + [f"engine.num_pages={engine_summary['kv']['num_pages']}"]


def replay(out: Path, cell) -> dict | None:
    """Simulate a cell into out/sim/<cell>; None when the cell has no engine run."""
    from testbed.config import compose
    from testbed.run import run
    runs = engine_runs(out, cell)
    if not runs:
        return None
    first = json.loads((runs[0] / "summary.json").read_text())
    d = out / "sim" / cell.name
    if d.is_dir():  # this report's own output of an earlier replay
        shutil.rmtree(d)
    return run(compose(sim_overrides(cell, first)), str(d), print_table=False)


def evaluate(out: Path, cells) -> dict:
    """Every cell's errors (the simulation re-run now); written to nothing."""
    res = {}
    for cell in cells:
        sim = replay(out, cell)
        if sim is None:
            res[cell.name] = {"missing": "no engine run"}
            continue
        runs = engine_runs(out, cell)
        eng = [json.loads((p / "summary.json").read_text()) for p in runs]
        incomplete = [p.name for p, e in zip(runs, eng) if not e.get("complete")]
        res[cell.name] = {"cell": cell.__dict__, "errors": cell_errors([e["metrics"] for e in eng], sim["metrics"]),
                          "engine_incomplete": incomplete}
    return res


def step_host_ratios(s: pd.DataFrame, cost) -> np.ndarray:
    """Per step of a run (steps.parquet): the engine's host time (host_s + launch_s) over the
    profile's host fit for the same step (1.0 = as profiled)."""
    p = cost.host_parts_arrays(s["batch_reqs"], s["prefill_tokens"] + s["decode_tokens"], s["context_tokens"])
    return (s["host_s"] + s["launch_s"]).to_numpy() / (np.asarray(p["host_s"]) + np.asarray(p["launch_s"]))


def host_ratio(s: pd.DataFrame, cost) -> float | None:
    """How fast the engine's host ran over a run: the median of step_host_ratios (None: no steps)."""
    return float(np.median(step_host_ratios(s, cost))) if len(s) else None


def pct(v) -> str:
    return "-" if v is None or v != v else f"{v:+.1%}"


def worst(res: dict, keys=HEADLINE, what="error") -> float:
    vals = [abs(c["errors"][k][what]) for c in res.values() if "errors" in c for k in keys
            if k in c["errors"] and c["errors"][k][what] is not None]
    return max(vals) if vals else float("nan")


def median_table(res: dict) -> str:
    """Median |error| and cells within 5% per headline metric, over all cells."""
    cells = {n: c for n, c in res.items() if "errors" in c}
    rows = ["| metric | median abs error | cells within 5% | median abs engine spread |", "|---|---|---|---|"]

    def med(k, what="error"):
        v = [abs(c["errors"][k][what]) for c in cells.values() if k in c["errors"] and c["errors"][k][what] is not None]
        return (float(np.median(v)) if v else float("nan")), sum(x <= BAR for x in v)
    for k in HEADLINE:
        (e, n5), (sp, _) = med(k), med(k, "spread")
        rows.append(f"| {label(k)} | {e:.1%} | {n5} of {len(cells)} | {sp:.1%} |")
    return "\n".join(rows)


def markdown(res: dict, out: Path, profile_info: dict, device: dict) -> str:
    speeds = [v for c in res.values() for v in c.get("host_ratio", []) if v is not None]
    lines = ["# Simulator fidelity against the engine", "",
             "Each cell ran twice on the engine (one GPU, named below; dummy weights) and once in the simulator "
             "(`costmodel=calibrated`, the profile below). Errors are the simulator's relative to the mean of the "
             "two engine runs; spread is the two engine runs' difference relative to their mean.", "",
             *[f"- profile `{v['profile']}` ({m}) on {v['gpu']} (driver {v['driver']}): device grid of the machine "
               f"starts of {', '.join(v['device_starts'])}"
               + (f" (per shape, a start lies a median {v['device_apart'][0]:.1%} from their median, p90 "
                  f"{v['device_apart'][1]:.1%})" if v["device_apart"] else "")
               + (f"; its CUDA-graph decode shapes from the machine starts of {', '.join(v['graph_starts'])}"
                  if v["graph_starts"] else "")
               + (f"; its decode graphs also fitted on the served steps of the machine starts of "
                  f"{', '.join(v['graph_sample_starts'])}" if v["graph_sample_starts"] else "")
               + (f"; its mixed steps corrected near the mixed shapes of its grid and of the machine starts of "
                  f"{', '.join(v['local_starts'])}" if v["local_starts"] else "")
               + f"; host fitted on the machine starts of {', '.join(v['host_starts'])}"
               for m, v in profile_info.items()],
             *engine_starts(out, list(res)), "",
             f"Reproduce the simulator side (no GPU): `python -m testbed.fidelity report out={shown_dir(out)}`. "
             "The engine side (a GPU): `python -m testbed.fidelity engine out=DIR`.", "",
             f"Worst headline error: {worst(res):.1%}; worst engine spread on those metrics: "
             f"{worst(res, what='spread'):.1%}.", "",
             median_table(res), "",
             "## Headline: simulator error (engine spread)", "",
             "The last column is each engine run's host speed: its host time per step (schedule, batch build, "
             "upload, kernel launch) over the profile's host fit for the same steps, the median over the run's "
             "steps (1.00: as profiled; 1.50: the host took half as long again). It is a property of the machine "
             "at the time of the run, not of the cell: it moves from run to run and within runs, and neither a CPU "
             "probe beside the engine nor one in its process before each run followed it "
             "(benchmarks/diag_thermo.py, benchmarks/results/host/). Where the engine is host-bound (Qwen3-0.6B at "
             "small batches, chunked prefill steps) its metrics move with this speed; the simulator replays every "
             "run at 1.00, and a step launched after an idle gap at the profile's wake factors"
             + "".join(f"; {m}: host x{v['wake'][0]:.2f}, launch x{v['wake'][1]:.2f}, device +{v['wake'][2] * 1e3:.2f} ms"
                       for m, v in profile_info.items() if v["wake"])
             + "." + (f" Over these engine runs the host speed had a median of {np.median(speeds):.2f} (from "
                      f"{min(speeds):.2f} to {max(speeds):.2f})." if speeds else ""), ""]
    head = ["cell", "req/s", "n"] + [label(k) for k in HEADLINE] + ["host speed r1 / r2"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in res.items():
        if "errors" not in c:
            lines.append(f"| {name} | {c.get('missing')} |")
            continue
        e = c["errors"]
        row = [name, f"{c['cell']['rate_rps']:.2f}", str(c["cell"]["num_requests"])]
        row += [f"{pct(e[k]['error'])} ({pct(e[k]['spread'])})" if k in e else "-" for k in HEADLINE]
        row.append(" / ".join("-" if v is None else f"{v:.2f}" for v in c.get("host_ratio", [])))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", *misses_section(res), "## Per-step device time: the cost model against the engine's steps", "",
              "Every engine step's batch is rebuilt from the run's requests.parquet and steps.parquet "
              "(testbed/fidelity/batches.py) and priced by the profile's device model; the ratio is predicted over "
              "measured (CUDA events) device time: the median step, and the sum of predicted over the sum of measured "
              "time. An eager step's measured time includes the device waiting for its kernels to be enqueued.", ""]
    for model, rows in device.items():
        lines += [f"**{model}** (every cell, both runs)", "", md_table(pd.DataFrame(rows)), ""]
    lines += ["", "## Every metric: engine mean, simulator, error", ""]
    for name, c in res.items():
        if "errors" not in c:
            continue
        lines.append(f"<details><summary>{name}</summary>\n")
        lines.append("| metric | engine r1 | engine r2 | sim | error | spread |\n|---|---|---|---|---|---|")
        for k in METRICS:
            if k in c["errors"]:
                v = c["errors"][k]
                ev = v["engine"] + [None] * (2 - len(v["engine"]))
                f = (lambda x: "-" if x is None else f"{x:,.2f}")
                lines.append(f"| {label(k)} | {f(ev[0])} | {f(ev[1])} | {f(v['sim'])} | {pct(v['error'])} | "
                             f"{pct(v['spread'])} |")
        st = c.get("steps")
        if st is not None:
            lines.append("\nMean step by kind (ms): interval = the time the step adds to the timeline\n")
            lines.append(md_table(pd.DataFrame(st)))
        if c.get("device_steps"):
            lines.append("\nDevice time per step, predicted / measured (both engine runs)\n")
            lines.append(md_table(pd.DataFrame(c["device_steps"])))
        lines.append("\n</details>\n")
    return "\n".join(lines) + "\n"


def md_table(df: pd.DataFrame) -> str:
    def f(v):
        return f"{v:,.3f}" if isinstance(v, float) else str(v)
    rows = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    rows += ["| " + " | ".join(f(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def cdf_plots(res: dict, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups: dict[tuple, list] = {}
    for name, c in res.items():
        if "errors" in c:
            groups.setdefault((c["cell"]["model"], c["cell"]["trace"]), []).append(name)
    written = []
    cols = [("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E (s)")]
    for (model, trace), names in groups.items():
        fig, axes = plt.subplots(len(names), 3, figsize=(12, 2.4 * len(names)), squeeze=False)
        for row, name in zip(axes, names):
            runs = {p.name: p for p in (out / "runs" / name).glob("r*")} | {"sim": out / "sim" / name}
            for who, p in sorted(runs.items()):
                f = p / "requests.parquet"
                if not f.is_file():
                    continue
                r = pd.read_parquet(f, columns=[c for c, _ in cols] + ["state"])
                r = r[r["state"] == "FINISHED"]
                for ax, (c, title) in zip(row, cols):
                    v = np.sort(r[c].dropna().to_numpy())
                    ax.plot(v, np.arange(1, len(v) + 1) / max(len(v), 1), label=who,
                            ls="--" if who == "sim" else "-")
                    ax.set_xlabel(title)
            row[0].set_ylabel(name.split("-", 1)[1], fontsize=7)
            row[0].legend(fontsize=7)
        fig.suptitle(f"{model} on {trace}: engine runs and the simulator")
        fig.tight_layout()
        path = out / f"cdf_{model}_{trace}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def write_report(out: Path, cells) -> dict:
    res = evaluate(out, cells)
    per_model: dict[str, list[pd.DataFrame]] = {}
    for name, c in res.items():
        if "errors" in c:
            cell = next(x for x in cells if x.name == name)
            runs = engine_runs(out, cell)
            engine = [(pd.read_parquet(p / "requests.parquet"), pd.read_parquet(p / "steps.parquet")) for p in runs]
            st = step_table(engine[0][1], pd.read_parquet(out / "sim" / name / "steps.parquet"))
            c["steps"] = st.to_dict(orient="records")
            cost = cell_cost_model(runs[0], cell)
            c["host_ratio"] = [host_ratio(steps, cost) for _, steps in engine]
            errs = pd.concat([step_device_errors(reqs, steps, cost) for reqs, steps in engine])
            per_model.setdefault(c["cell"]["model"], []).append(errs)  # for the all-cells table
            c["device_steps"] = device_error_table(errs).to_dict(orient="records")
    prof = profile_info(out, cells)
    device = {m: device_error_table(pd.concat(v)).to_dict(orient="records") for m, v in per_model.items()}
    (out / "fidelity.json").write_text(json.dumps({"profiles": prof, "cells": res, "device_steps": device}, indent=1,
                                                  default=str) + "\n")
    (out / "report.md").write_text(markdown(res, out, prof, device))
    cdf_plots(res, out)
    return res


def cell_cost_model(run: Path, cell):
    """The calibrated cost model the simulator replays the cell with."""
    from testbed import assemble
    from testbed.config import compose
    cfg = compose(sim_overrides(cell, json.loads((run / "summary.json").read_text())))
    return assemble.cost_model(cfg, assemble.model_spec(cfg))[0]


class PricedRun(NamedTuple):
    cost: Any  # the cost model the simulator replays the cell with
    steps: pd.DataFrame  # the run's steps.parquet
    batches: list  # its steps' (extend, cached) lengths, or None (step_batches)
    requests: pd.DataFrame  # the run's requests.parquet


def priced_runs(out: Path, model: str):
    """A PricedRun per engine run of `model`'s cells in out/plan.json, for the scripts that
    price every served step."""
    from testbed.fidelity.cells import read_plan
    for cell in read_plan(out / "plan.json"):
        if cell.model != model:
            continue
        for run in engine_runs(out, cell):
            reqs, steps = pd.read_parquet(run / "requests.parquet"), pd.read_parquet(run / "steps.parquet")
            yield PricedRun(cell_cost_model(run, cell), steps, step_batches(reqs, steps), reqs)


def shown_dir(out: Path) -> str:
    """The report's directory as its reader types it: relative to the repo when inside it."""
    out = out.resolve()
    return str(out.relative_to(REPO)) if out.is_relative_to(REPO) else str(out)


def engine_starts(out: Path, cells: list[str]) -> list[str]:
    """The report's lines naming the machine starts the cells' engine runs were made on: each
    cell's runs/<cell>/machine.json, or runs/machine.json for runs made before cells kept their own."""
    by_start: dict[str, list[str]] = {}
    files: dict[str, set[str]] = {}
    for c in cells:
        f = next((f for f in (out / "runs" / c / "machine.json", out / "runs" / "machine.json") if f.is_file()), None)
        m = json.loads(f.read_text()) if f else {"date": "? (no machine.json)"}
        date = m.get("date", "?") + (f" on {m['gpu']}" if m.get("gpu") else "")
        by_start.setdefault(date, []).append(c)
        if f:
            files.setdefault(date, set()).add("runs/machine.json" if f.parent.name == "runs" else "runs/<cell>/machine.json")
    where = {d: f" ({', '.join(f'`{x}`' for x in sorted(files[d]))})" if d in files else "" for d in by_start}
    if len(by_start) == 1:
        d = next(iter(by_start))
        return [f"- engine runs: one machine start, recorded at {d}{where[d]}"]
    most = max(by_start, key=lambda d: len(by_start[d]))  # the bulk of the cells, named by what they are not
    return [f"- engine runs of the other {len(v)} cells: the machine start recorded at {d}{where[d]}" if d == most else
            f"- engine runs of {', '.join(v)}: the machine start recorded at {d}{where[d]}"
            for d, v in sorted(by_start.items(), key=lambda dv: dv[0] == most)]


def profile_info(out: Path, cells) -> dict:
    from testbed.sim.costmodel.calibrated import load_profile
    info = {}
    from testbed.fidelity.cells import profile_name
    for model, name in sorted({(c.model, profile_name(c.overrides, c.profile)) for c in cells}):
        try:
            p = load_profile(name)
        except ValueError:
            continue
        m = p["machine"]
        # how far the pooled machine starts' device grids lie apart, per shape measured on several
        apart = [abs(t / np.median(v) - 1) for d in p["samples"]["device"]
                 if len(v := d.get("device_s_by_start", [])) > 1 for t in v]
        w = p["host"]["all"].get("wake")
        info[model] = {"host_starts": [h.get("date") for h in p.get("host_machines", [m])],
                       "wake": (w["host"], w["launch"], w.get("device_s", 0.0)) if w else None,
                       "device_starts": [h.get("date") for h in p.get("device_machines", [m])],
                       "graph_starts": [h.get("date") for h in p.get("graph_machines", [])],
                       "local_starts": [h.get("date") for h in p.get("local_machines", [])],
                       "graph_sample_starts": [h.get("date") for h in p.get("graph_sample_machines", [])],
                       "device_apart": (float(np.median(apart)), float(np.percentile(apart, 90))) if apart else None,
                       "profile": name, "measured": m.get("date"), "gpu": m.get("gpu"),
                       "driver": m.get("driver"), "cpu": m.get("cpu"), "host": m.get("host")}
    return info
