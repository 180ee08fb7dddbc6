"""How far the engine's own figures move between machine starts: the same fidelity cells, run
on several starts (each a fidelity directory whose report was written: fidelity.json), each
start's figure the mean of its runs; per headline metric, the pairwise relative difference
between starts over every cell, beside the two runs' spread within a start.

    python benchmarks/engine_across_starts.py DIR DIR [...] [--out FILE]

e.g. `python benchmarks/engine_across_starts.py benchmarks/results/fidelity
benchmarks/results/fidelity/start_1204 benchmarks/results/fidelity/same_start_1201
benchmarks/results/fidelity/start_1206`."""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import sys

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testbed.fidelity.compare import HEADLINE  # noqa: E402  (the report's seven metrics)


def load(d: Path) -> dict:
    f = d / "fidelity.json"
    if not f.is_file():
        raise SystemExit(f"error: {f} not found (write it with `python -m testbed.fidelity report out={d}`)")
    return {name: c["errors"] for name, c in json.loads(f.read_text())["cells"].items() if c.get("errors")}


def compare(starts: dict[str, dict]) -> dict:
    """Per metric: the between-start differences (median, p90, max and the cell of the max) and
    the median within-start spread, over the cells every start ran."""
    cells = sorted(set.intersection(*(set(s) for s in starts.values())))
    if not cells:
        raise SystemExit("error: no cell was run on every start given")
    out = {}
    for m in HEADLINE:
        diffs = []
        for cell in cells:
            means = {k: float(np.mean(s[cell][m]["engine"])) for k, s in starts.items()}
            diffs += [(abs(means[a] / means[b] - 1), cell) for a, b in itertools.combinations(means, 2)]
        d = np.array([x for x, _ in diffs])
        spread = [s[c][m]["spread"] for s in starts.values() for c in cells]
        out[m] = {"between_median": float(np.median(d)), "between_p90": float(np.percentile(d, 90)),
                  "between_max": float(d.max()), "max_cell": max(diffs)[1],
                  "within_median": float(np.median(spread))}
    return {"starts": list(starts), "cells": len(cells), "metrics": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if len(a.dirs) < 2:
        raise SystemExit("error: give two fidelity directories or more (one a start)")
    res = compare({str(d): load(d) for d in a.dirs})
    print(f"{res['cells']} cells on {len(a.dirs)} starts; between starts (pairwise, the mean of each start's runs) "
          f"and within a start (its runs' spread):")
    for m, r in res["metrics"].items():
        print(f"  {m:22s} median {r['between_median']:.1%}  p90 {r['between_p90']:.1%}  max {r['between_max']:.1%} "
              f"({r['max_cell']})  | within {r['within_median']:.1%}")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
