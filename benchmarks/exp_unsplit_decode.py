"""Experiment (issue #11): what a decode CUDA graph too large for the split-KV plan costs when a
few of its rows are much longer than the rest.

The fidelity runs' decode graphs of 160 and 176 rows (Qwen3-0.6B on the H200: rows x 8 KV heads
beyond the plan's 1,184-block grid, so one block per row and head, and no split) are priced by
how long their longest row is against their mean: a median 1.01-1.06 of their measured time where
the longest row is under twice the mean, 0.96 where it is 3-4x (18,927 steps of 65+ rows over the
four committed H200 run sets; the profile's grid holds full batches of near, spread, skewed and
served-like contexts, none with a few rows far beyond the others). This lays out that case on its
own: for graph sizes on both sides of the split limit, batches of log-normal contexts (sigma 0.35,
as served) around a mean, full and 8 rows short of the graph (padding rows, as served), with no
long row, one row at 3x / 5x / 8x the mean, or four at 3x.

    python benchmarks/exp_unsplit_decode.py --out BATCHES.json                  # CPU: the batches
    python benchmarks/measure_served_batches.py time --profile testbed/sim/costmodel/profiles/h200_qwen3_0_6b.json \\
        --batches BATCHES.json --out TIMED.json                                  # GPU: time them
    python benchmarks/exp_unsplit_decode.py --timed TIMED.json                  # CPU: priced / measured

The timing is the step profiler's (measure_served_batches.py: device held until the step is
enqueued, median of repeats)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = (128, 144, 160, 176, 192, 224)  # graph sizes: 128 / 144 split, 160+ unsplit on the H200
MEANS = (600, 1200)  # context tokens
LONG = (("none", 0, 0.0), ("one_3x", 1, 3.0), ("one_5x", 1, 5.0), ("one_8x", 1, 8.0), ("four_3x", 4, 3.0))
PAD = (0, 8)  # rows short of the graph size


def contexts(mean: int, rows: int, n_long: int, factor: float) -> np.ndarray:
    """rows contexts: log-normal (sigma 0.35) quantiles around `mean` in a fixed shuffled order,
    the first n_long of them (after the shuffle) set to factor x mean."""
    z = np.array([NormalDist().inv_cdf((i + 0.5) / rows) for i in range(rows)])
    c = np.maximum(1, np.round(mean * np.exp(0.35 * z - 0.35 ** 2 / 2))).astype(np.int64)
    c = c[np.random.default_rng(rows * 7919 + mean).permutation(rows)]
    c[:n_long] = int(round(factor * mean))
    return c


def make(out: Path) -> None:
    batches = []
    for size in SIZES:
        for mean in MEANS:
            for pad in PAD:
                for name, n_long, factor in LONG:
                    ctx = contexts(mean, size - pad, n_long, factor)
                    batches.append({"kind": "decode", "label": f"{size}/{mean}/pad{pad}/{name}",
                                    "extend": [1] * len(ctx), "cached": (ctx - 1).tolist()})
    out.write_text(json.dumps({"batches": batches}) + "\n")
    print(f"{len(batches)} batches written to {out}")


def report(timed: Path, profile: Path) -> None:
    """Each timed batch priced by the profile: predicted / measured, by label."""
    from testbed.assemble import profile_cost_model
    got = json.loads(timed.read_text())
    cost = profile_cost_model(profile, got["model"]["name"], got["hardware"]["name"])
    rows = []
    for s in got["samples"]["device"]:
        n, c = np.asarray(s["extend_lens"]), np.asarray(s["cached_lens"])
        rows.append((s.get("label", ""), len(n), float(cost.device_time(n, c)) / s["device_s"], s["device_s"]))
    for label, r, ratio, t in rows:
        print(f"{label:28s} {r:4d} rows  {t * 1e3:7.3f} ms  priced {ratio:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--timed", type=Path)
    ap.add_argument("--profile", type=Path, default=ROOT / "testbed/sim/costmodel/profiles/h200_qwen3_0_6b.json")
    a = ap.parse_args()
    if a.out:
        make(a.out)
    elif a.timed:
        report(a.timed, a.profile)
    else:
        ap.error("--out (make the batches) or --timed (price the timed ones)")


if __name__ == "__main__":
    main()
