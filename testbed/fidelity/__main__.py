"""`python -m testbed.fidelity STEP [key=value ...]`: the simulator against the engine.

Steps:
  plan     the matrix and each cell's load (the simulator estimates each policy and trace's
           capacity with the calibrated profile); writes OUT/plan.json
  engine   run every cell of OUT/plan.json on the engine, `repeats` times (a GPU machine);
           writes OUT/runs/<cell>/r<k>/
  report   replay every cell in the simulator and compare; writes OUT/report.md,
           OUT/fidelity.json and OUT/cdf_*.png (no GPU needed)
  check    replay again and fail (exit 1) if any cell's headline error grew beyond the
           committed OUT/fidelity.json by more than `margin` (CI)

Keys: out=DIR (default benchmarks/results/fidelity), repeats=N (default 2), cells=A,B (cell
names or substrings to keep; with plan, the cells planned), margin=F (default 0.01, an absolute
fraction), hardware=NAME (plan only: the GPU the cells are planned for, whose profile of each
model sets the loads; default h200; the engine side runs on whatever GPU the machine has)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {"out": str(REPO / "benchmarks" / "results" / "fidelity"), "repeats": "2", "cells": "", "margin": "0.01",
            "hardware": ""}
STEPS = ("plan", "engine", "report", "check")


def parse(argv: list[str]) -> tuple[str, dict]:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in STEPS:
        raise SystemExit(__doc__ if not argv or argv[0] in ("-h", "--help")
                         else f"error: step {argv[0]!r} is unknown; allowed: {', '.join(STEPS)}")
    opts = dict(DEFAULTS)
    for a in argv[1:]:
        k, eq, v = a.partition("=")
        if not eq or k not in DEFAULTS:
            raise SystemExit(f"error: argument {a!r} is invalid; allowed: {', '.join(f'{k}=...' for k in DEFAULTS)}")
        opts[k] = v
    for k, kind, low in (("repeats", int, 1), ("margin", float, 0)):
        try:
            ok = kind(opts[k]) >= low
        except ValueError:
            ok = False
        if not ok:
            raise SystemExit(f"error: {k}={opts[k]!r} is invalid; allowed: {'an integer' if kind is int else 'a number'} "
                             f">= {low}")
    return argv[0], opts


def selected(items, spec: str, name=lambda c: c.name):
    """The items (cells, or the matrix's tuples with `name`) whose name holds one of spec's
    comma-separated keys; every item for an empty spec."""
    if not spec:
        return items
    keys = spec.split(",")
    out = [c for c in items if any(k in name(c) for k in keys)]
    if not out:
        raise SystemExit(f"error: cells={spec!r} matches no cell; cells: {', '.join(name(c) for c in items)}")
    return out


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING)
    step, o = parse(sys.argv[1:] if argv is None else argv)
    from testbed.fidelity.cells import HARDWARE, cell_name, default_matrix, plan_cells, read_plan, write_plan
    out = Path(o["out"])
    if o["hardware"] and step != "plan":
        raise SystemExit(f"error: hardware= goes with plan (a planned cell's overrides name its hardware), not {step}")
    if step == "plan":
        if (out / "plan.json").is_file() and (out / "runs").is_dir():
            raise SystemExit(f"error: {out / 'plan.json'} already has engine runs beside it (the cells as they were "
                             f"run); plan a new experiment into another out=DIR")
        matrix = selected(default_matrix(), o["cells"], lambda m: cell_name(*m))
        try:
            cells = plan_cells(matrix, o["hardware"] or HARDWARE)
        except ValueError as e:  # an unknown hardware, or no profile of a model on it
            raise SystemExit(f"error: {e}")
        write_plan(cells, out / "plan.json")
        for c in cells:
            print(f"{c.name:<48} capacity {c.capacity_rps:7.2f} req/s  rate {c.rate_rps:7.2f}  n {c.num_requests}")
        print(f"written {out / 'plan.json'}")
        return 0
    try:
        cells = selected(read_plan(out / "plan.json"), o["cells"])
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}")
    if step == "engine":
        from testbed.fidelity.engine_side import run_engine_cells
        try:
            failed = run_engine_cells(cells, out, int(o["repeats"]))
        except (ValueError, FileNotFoundError) as e:  # the model or engine could not be built
            print(f"error: {e}", file=sys.stderr)
            return 2
        for f in failed:
            print(f"failed: {f}", file=sys.stderr)
        return 1 if failed else 0
    if step == "report":
        from testbed.fidelity.report import engine_runs, worst, write_report
        missing = [c.name for c in cells if not engine_runs(out, c)]
        if len(missing) == len(cells):
            raise SystemExit(f"error: no engine runs under {out / 'runs'} for these cells; run them first with "
                             f"`python -m testbed.fidelity engine out={out}` on a GPU machine")
        if missing:
            print(f"note: {len(missing)} of {len(cells)} cells have no engine run yet (reported as such): {', '.join(missing)}",
                  file=sys.stderr)
        res = write_report(out, cells)
        print((out / "report.md").read_text().split("## Every metric")[0])
        print(f"worst headline error {worst(res):.1%}; written {out / 'report.md'}")
        return 0
    from testbed.fidelity.check import check
    return check(out, cells, float(o["margin"]))


if __name__ == "__main__":
    sys.exit(main())
