"""Run simulator sweeps from Python (notebooks, tests): a subprocess of the ordinary CLI,
`python -m testbed.run -m ...`, so a notebook's sweep is exactly what a shell would run.

    d = run_sweep({"policy": ["prefill_first", "chunked"], "trace.rate": [2, 8]},
                  fixed=["trace.num_requests=200"], sweep_dir=tmp)
    r = analysis.load(d)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sweep_args(grid: dict | list | None = None, fixed=()) -> list[str]:
    """Hydra override strings: a grid {key: [values]} becomes `key=v1,v2`; fixed is a list of
    `key=value` strings (or a dict) applied to every job."""
    out = []
    if isinstance(grid, dict):
        out += [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in grid.items()]
    elif grid:
        out += list(grid)
    if isinstance(fixed, dict):
        out += [f"{k}={v}" for k, v in fixed.items()]
    else:
        out += list(fixed)
    return out


def run_sweep(grid: dict | list | None = None, fixed=(), sweep_dir: str | Path | None = None,
              launcher: str | None = "joblib", n_jobs: int | None = None, module: str = "testbed.run",
              timeout: float | None = 600, quiet: bool = True) -> Path:
    """Run a multirun and return its directory (a fresh temporary one unless sweep_dir is given).
    launcher: a hydra/launcher choice (joblib runs jobs in parallel on this machine; None:
    Hydra's basic launcher, one after another). n_jobs: joblib workers (default: all cores).
    Raises RuntimeError with the end of the output when the sweep fails."""
    sweep_dir = Path(sweep_dir) if sweep_dir else Path(tempfile.mkdtemp(prefix="testbed-sweep-"))
    args = [sys.executable, "-m", module, "-m", *sweep_args(grid, fixed), "progress=false",
            f"hydra.sweep.dir={sweep_dir}"]
    if launcher:
        args.append(f"hydra/launcher={launcher}")
        if launcher == "joblib" and n_jobs:
            args.append(f"hydra.launcher.n_jobs={n_jobs}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    p = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        tail = (p.stdout + p.stderr)[-3000:]
        raise RuntimeError(f"sweep failed (exit {p.returncode}): {' '.join(args[1:])}\n{tail}")
    if not quiet:
        print(f"{sweep_dir}: done in {time.perf_counter() - t0:.1f} s")
    return sweep_dir
