"""Eager steps (prefill-only, and mixed: a chunk beside decodes) of the fidelity runs priced by
the committed profiles against their measured device time, binned by new tokens and by how much
of the piecewise CUDA graph they run in is padding ((graph size - tokens) / graph size). The
padding rows run the linear layers but not attention, so a price that took the padded prompt's
attention shows as an error growing with the padding.

    python benchmarks/padded_prefill_errors.py [--dirs DIR,DIR] [--model qwen3_0_6b] [--out FILE]

No GPU: every step is rebuilt from the runs' files (testbed/fidelity/batches.py). --dirs: fidelity
directories with plan.json and runs/ (default: the four committed H200 run sets)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FID = ROOT / "benchmarks/results/fidelity"
RUN_SETS = ("", "start_1204", "start_1206", "same_start_1201")
TOKEN_BINS = (0, 256, 1024, 2048, 4096, 8192)
PAD_BINS = (-0.01, 0.001, 0.05, 0.1, 0.15, 1.0)


def eager_steps(dirs, model: str) -> pd.DataFrame:
    from testbed.fidelity.report import priced_runs
    rows = []
    for d in dirs:
        for cost, steps, batches, _ in priced_runs(d, model):
            dur = steps["duration_s"].to_numpy()
            for i, b in enumerate(batches):
                if b is None or int(b[0].sum()) == len(b[0]):  # unknown, or decode only
                    continue
                t = int(b[0].sum())
                pad = float(cost.padded(t))
                rows.append({"mixed": bool((b[0] == 1).any()), "tokens": t, "padding": (pad - t) / pad,
                             "ratio": float(cost.device_time(*b)) / float(dur[i])})
    return pd.DataFrame(rows)


def table(df: pd.DataFrame) -> list[dict]:
    """count and median predicted / measured per (kind, token bin, padding bin)."""
    out = []
    df = df.assign(tb=pd.cut(df["tokens"], TOKEN_BINS), pb=pd.cut(df["padding"], PAD_BINS))
    for (mixed, tb, pb), g in df.groupby(["mixed", "tb", "pb"], observed=True):
        out.append({"kind": "mixed" if mixed else "prefill", "tokens": f"{tb.left + 1}-{tb.right}",
                    "padding": f"{max(pb.left, 0):.3f}-{pb.right:.3f}", "steps": len(g),
                    "median_ratio": round(float(g["ratio"].median()), 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dirs", default=",".join(str(FID / s) for s in RUN_SETS))
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*beyond the profiled range.*")
    df = eager_steps([Path(d) for d in a.dirs.split(",")], a.model)
    if df.empty:
        raise SystemExit(f"error: no eager steps of model {a.model!r} in {a.dirs}")
    rows = table(df)
    for r in rows:
        print(f"{r['kind']:8s} tokens {r['tokens']:>10s} padding {r['padding']}: {r['steps']:6d} steps, "
              f"median predicted / measured {r['median_ratio']:.3f}")
    if a.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        a.out.write_text(json.dumps({"command": "python benchmarks/padded_prefill_errors.py", "model": a.model,
                                     "commit": commit.stdout.strip(), "dirs": a.dirs.split(","),
                                     "bins": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
