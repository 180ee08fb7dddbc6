"""How many of a run's steps a fast path for steps with prefill chunks could take at once: the
steps whose batch has the shape of the step before (as many decodes, the same prefill items and
tokens, no admission, nothing waiting admitted), counted in runs of such steps from a run's
steps.parquet. A stretch of n steps of one shape saves n - 1 single steps at most (its first is
planned by the policy as now), before the per-stretch cost of applying it.

    python benchmarks/results/sim_speed_experiments/chunk_segments.py RUN_DIR [RUN_DIR ...]
"""
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def segments(steps_parquet: Path) -> dict:
    t = pq.read_table(steps_parquet, columns=["decode_reqs", "prefill_reqs", "prefill_tokens", "admitted"])
    d, p, n, a = (t.column(c).to_numpy() for c in ("decode_reqs", "prefill_reqs", "prefill_tokens", "admitted"))
    chunk = p > 0
    same = np.zeros(len(d), bool)
    same[1:] = chunk[1:] & (a[1:] == 0) & (d[1:] == d[:-1]) & (p[1:] == p[:-1]) & (n[1:] == n[:-1])
    # runs of `same` steps: each run's steps could go at once after the step that starts it
    edges = np.flatnonzero(np.diff(np.concatenate([[0], same.astype(np.int8), [0]])))
    lengths = edges[1::2] - edges[::2]
    return {"steps": int(len(d)), "chunk_steps": int(chunk.sum()), "repeat_shape_steps": int(same.sum()),
            "runs": int(len(lengths)), "mean_run": round(float(lengths.mean()), 2) if len(lengths) else 0.0}


if __name__ == "__main__":
    for run in sys.argv[1:]:
        print(run, segments(Path(run) / "steps.parquet"))
