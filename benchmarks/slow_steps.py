"""How often a machine start's decode steps run slow: the share of decode-only steps whose
device time is 1.2x or more what the other steps of the same batch size take at the same
KV (a least-squares line in context tokens per batch size, sizes with 30 steps or more),
and the share of decode time they hold. For engine runs (steps.parquet files) and for a
profile's host workloads (its samples.host: the served-like steps it ran on its own start),
so a start's slow steps can be told from the cost model's error.

    python benchmarks/slow_steps.py RUNS_GLOB|PROFILE.json [...] [--out FILE]

e.g. `python benchmarks/slow_steps.py testbed/sim/costmodel/profiles/h100_qwen3_0_6b.json
'benchmarks/results/fidelity/h100/runs/*/r*/steps.parquet'`."""
from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import numpy as np

SLOW = 1.2  # a step this many times its line's time or more is slow
MIN_STEPS = 30  # a batch size's line needs this many steps


def decode_steps(source: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(batch size, context tokens, device seconds) of the decode-only steps, per file."""
    import pandas as pd
    if source.endswith(".json"):
        try:
            h = json.loads(Path(source).read_text())["samples"]["host"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"error: {source}: not a profile with host workload samples ({err!r})") from err
        frames = [pd.DataFrame({k: h[k] for k in ("prefill_reqs", "batch_reqs", "context_tokens", "duration_s")})]
    else:
        paths = sorted(glob.glob(source))
        if not paths:
            raise SystemExit(f"error: {source}: no steps.parquet file matches")
        frames = [pd.read_parquet(p, columns=["prefill_reqs", "batch_reqs", "context_tokens", "duration_s"])
                  for p in paths]
    out = []
    for s in frames:
        s = s[(s.prefill_reqs == 0) & (s.batch_reqs > 0)]
        out.append((s.batch_reqs.to_numpy(), s.context_tokens.to_numpy(float), s.duration_s.to_numpy(float)))
    return out


def ratios(b: np.ndarray, ctx: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Each step's time over its batch size's line (sizes with too few steps left out)."""
    got = []
    for size in np.unique(b):
        m = b == size
        if m.sum() < MIN_STEPS:
            continue
        a = np.vstack([np.ones(m.sum()), ctx[m]]).T
        coef, *_ = np.linalg.lstsq(a, dur[m], rcond=None)
        got.append(dur[m] / (a @ coef))
    return np.concatenate(got) if got else np.zeros(0)


def summary(source: str) -> dict:
    r = np.concatenate([ratios(*f) for f in decode_steps(source)])
    if not len(r):
        return {"source": source, "decode_steps": 0}
    slow = r >= SLOW * np.median(r)
    return {"source": source, "decode_steps": int(len(r)), "slow_share": float(slow.mean()),
            "slow_time_share": float(r[slow].sum() / r.sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", help="a glob of steps.parquet files, or a profile .json")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = [summary(s) for s in a.sources]
    for s in rows:
        if s["decode_steps"]:
            print(f"{s['source']}: {s['decode_steps']} decode steps, {s['slow_share']:.2%} at {SLOW}x their "
                  f"line or more, {s['slow_time_share']:.2%} of the time")
        else:
            print(f"{s['source']}: no batch size with {MIN_STEPS} decode steps")
    if a.out:
        a.out.write_text(json.dumps({"slow": SLOW, "min_steps": MIN_STEPS, "sources": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
