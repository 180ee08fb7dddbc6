"""The simulator's output files from two source trees, run by run: benchmarks/sim_fingerprint.py's
runs (each policy on each bundled trace, the other axes, the eviction orders) and each policy's
knobs, each run from the command line in both trees. requests.parquet and steps.parquet must hold row-equal DataFrames and summary.json
the same metrics; whether the files are also byte-identical is reported beside. For a change
that renames settings, --rename OLD=NEW translates the base tree's overrides to this tree's.

    git worktree add --detach ../base main
    python benchmarks/sim_compare.py --base ../base [--requests 50] [--rename policy.x=scheduler.x] [--added-columns a,b]

Exits 1 when any run differs or fails (in either tree: a run both trees refuse compares nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_fingerprint import runs as fingerprint_runs  # noqa: E402  the same runs, one list

# knobs each policy reads, in the base tree's names: a rename must keep their effect
KNOBS = [["policy=chunked", "scheduler.max_running=4"], ["policy=prefill_first", "scheduler.max_running=3"],
         ["policy=prefill_first", "policy.max_prefill_tokens=512"], ["policy=decode_first", "policy.max_prefill_tokens=300"],
         ["policy=chunked", "policy.token_budget=128"], ["policy=chunked", "policy.chunk_size=64"]]
FILES = ("requests.parquet", "steps.parquet")


def renamed(overrides: list[str], renames: dict[str, str]) -> list[str]:
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        out.append(f"{renames.get(key, key)}{eq}{value}")
    return out


def run_in(tree: Path, overrides: list[str], out: Path) -> str | None:
    """Run the simulator of `tree` into `out`; None, or its error line."""
    p = subprocess.run([sys.executable, "-m", "testbed.run", *overrides, f"hydra.run.dir={out}"], cwd=tree,
                       env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if p.returncode:
        return (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return None


def cells_equal(fa: pd.DataFrame, fb: pd.DataFrame) -> pd.DataFrame:
    """Cell by cell, as DataFrame.equals sees them: both missing is equal, list cells (the
    per-token times, the chunks) compare as tuples."""
    def norm(d):
        return d.apply(lambda col: col.map(lambda v: tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else v))
    a, b = norm(fa), norm(fb)
    return (a == b) | (a.isna() & b.isna())


def compare(a: Path, b: Path, added: tuple[str, ...] = ()) -> list[str]:
    """What differs between two run directories (empty: nothing); `added`: columns only the
    second may have (a schema that grew), left out of the comparison."""
    diffs = []
    for name in FILES:
        fa, fb = pd.read_parquet(a / name), pd.read_parquet(b / name)
        fb = fb.drop(columns=[c for c in added if c in fb.columns and c not in fa.columns])
        if list(fa.columns) != list(fb.columns):
            diffs.append(f"{name}: columns {sorted(set(fa.columns) ^ set(fb.columns))} in one only")
        elif not fa.equals(fb):
            rows = len(fa) if len(fa) != len(fb) else int((~cells_equal(fa, fb)).any(axis=1).sum())
            diffs.append(f"{name}: {rows} rows differ ({len(fa)} vs {len(fb)} rows)")
    ma, mb = (json.loads((d / "summary.json").read_text())["metrics"] for d in (a, b))
    # a metric this tree added is no difference; one it dropped or changed is
    changed = sorted(k for k in ma if k not in mb or ma[k] != mb[k])
    if changed:
        diffs.append(f"summary metrics differ: {changed}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other source tree (a worktree of main)")
    ap.add_argument("--requests", type=int, default=50, help="trace.num_requests of every run")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="a setting's name in the base tree and in this one")
    ap.add_argument("--added-columns", default="", metavar="A,B",
                    help="columns this tree's files added (compared without them)")
    ap.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary one)")
    a = ap.parse_args(argv)
    try:
        renames = dict(r.split("=", 1) for r in a.rename)
    except ValueError:
        ap.error(f"--rename takes OLD=NEW, got {a.rename}")
    base = a.base.resolve()
    if not (base / "testbed" / "run.py").is_file():
        ap.error(f"--base {base}: not a testbed source tree")
    common = ["progress=false", f"trace.num_requests={a.requests}"]
    runs = fingerprint_runs() + [["trace=sharegpt"] + k for k in KNOBS]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        top = a.keep or Path(tmp)
        for i, r in enumerate(runs):
            dirs = (top / f"{i}_base", top / f"{i}_this")
            errs = (run_in(base, common + r, dirs[0]), run_in(ROOT, common + renamed(r, renames), dirs[1]))
            if any(errs):  # a run that fails compares nothing, in one tree or both
                same = False
                verdict = (f"NOT COMPARED, both fail: {errs[0]}" if errs[0] == errs[1]
                           else f"FAILS: base {errs[0]!r}, this {errs[1]!r}")
            else:
                diffs = compare(*dirs, tuple(c for c in a.added_columns.split(",") if c))
                same = not diffs
                identical = all((dirs[0] / f).read_bytes() == (dirs[1] / f).read_bytes() for f in FILES)
                verdict = ("row-equal, " + ("byte-identical" if identical else "bytes differ")) if same else \
                    "DIFFERS: " + "; ".join(diffs)
            bad += not same
            print(f"{' '.join(renamed(r, renames))} | {verdict}", flush=True)
    print(f"{len(runs) - bad} of {len(runs)} runs the same in {base} and {ROOT}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
