"""Do the fidelity runs' CUDA-graph decode steps drift against their price as a run goes on?

The runs' decode graphs of 33+ rows are priced 1-2% short on every machine start, while the same
batches timed alone, the GPU idle between shapes, come within about 1%. If a GPU kept busy for
seconds ran slower (clocks under sustained load), the price / measured ratio would fall with the
time since the run's first step and with how busy the device was in the second before the step.
If the KV's layout set it (issue #17: a request's decoded tokens lie one a step among its batch's,
its prompt in one run; the step profiler lays out 20% of a row that way), the ratio would fall with
the share of the step's KV tokens its rows decoded themselves. This bins every rebuilt
decode-graph step of a run set's Qwen3-0.6B cells by each of the three, and the graphs of 65+ rows
by their longest row over their mean context (past the split-KV limit, 149 rows on the H200, a
graph runs a block per row and KV head: benchmarks/exp_unsplit_decode.py).

    python benchmarks/decode_step_drift.py [--dir DIR] [--model qwen3_0_6b] [--out FILE]

No GPU: the steps are rebuilt from the runs' files (testbed/fidelity/batches.py)."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ROWS = (0, 8, 32, 64, 256)
SINCE_START = (0, 1, 2, 5, 10, 1000)  # seconds
BUSY = (0, 0.8, 0.95, 1.0)  # device busy share of the second before the step
DECODED = (0, 0.1, 0.2, 0.3, 0.5, 1.0)  # share of the step's KV tokens its rows decoded (interleaved)
LONGEST = (0, 2, 3, 4, 100)  # the longest row's context over the batch's mean
ROWS_LONGEST = (64, 144, 160, 176, 256)  # split on the H200 up to 148 rows; 160, 176: graph sizes


def busy_before(start: np.ndarray, duration: np.ndarray, window: float = 1.0) -> np.ndarray:
    """Per step: the device time of the steps that started in the `window` seconds before it,
    over that window (over the time since the first step, early in the run)."""
    cum = np.concatenate([[0.0], np.cumsum(duration)])
    first = np.searchsorted(start, start - window, side="left")
    span = np.minimum(window, start - start[0])
    out = np.ones(len(start))
    ok = span > 0
    out[ok] = (cum[:-1][ok] - cum[first][ok]) / span[ok]
    return np.minimum(out, 1.0)


def decode_steps(d: Path, model: str) -> pd.DataFrame:
    from testbed.fidelity.batches import decoded_tokens
    from testbed.fidelity.report import priced_runs
    rows = []
    for cost, steps, batches, reqs in priced_runs(d, model):
        start, dur = steps["start_s"].to_numpy(), steps["duration_s"].to_numpy()
        busy = busy_before(start, dur)
        decoded = decoded_tokens(reqs, steps)
        for i, b in enumerate(batches):
            if b is None or not (b[0] == 1).all() or not cost.is_graph(b[0]):
                continue
            ctx = b[0] + b[1]
            rows.append({"rows": len(b[0]), "since_start_s": float(start[i] - start[0]), "busy": float(busy[i]),
                         "longest_over_mean": float(ctx.max() / ctx.mean()),
                         "decoded_share": float(decoded[i]) / float((b[0] + b[1]).sum()),
                         "ratio": float(cost.device_time(*b)) / float(dur[i])})
    return pd.DataFrame(rows)


def bins(df: pd.DataFrame, col: str, edges, rows=ROWS) -> list[dict]:
    out = []
    df = df.assign(rb=pd.cut(df["rows"], rows), xb=pd.cut(df[col], edges, include_lowest=True))
    for (rb, xb), g in df.groupby(["rb", "xb"], observed=True):
        out.append({"rows": f"{rb.left + 1}-{rb.right}", col: f"{max(xb.left, 0):g}-{xb.right:g}", "steps": len(g),
                    "median_ratio": round(float(g["ratio"].median()), 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=ROOT / "benchmarks/results/fidelity")
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*beyond the profiled range.*")
    df = decode_steps(a.dir, a.model)
    if df.empty:
        raise SystemExit(f"error: no CUDA-graph decode steps of model {a.model!r} in {a.dir}")
    res = {"since_start": bins(df, "since_start_s", SINCE_START), "busy_before": bins(df, "busy", BUSY),
           "decoded_share": bins(df, "decoded_share", DECODED),
           "longest_over_mean": bins(df, "longest_over_mean", LONGEST, ROWS_LONGEST)}
    for key, rows in res.items():
        for r in rows:
            print(f"{key:12s} rows {r['rows']:>7s} {list(r.values())[1]:>9s}: {r['steps']:6d} steps, "
                  f"median predicted / measured {r['median_ratio']:.3f}")
    if a.out:
        from testbed.fidelity.report import shown_dir
        a.out.write_text(json.dumps({"command": "python benchmarks/decode_step_drift.py", "dir": shown_dir(a.dir),
                                     "model": a.model, **res}, indent=1) + "\n")


if __name__ == "__main__":
    main()
