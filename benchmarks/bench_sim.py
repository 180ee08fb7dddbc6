"""Simulator speed, whole process (issue #13): each workload run alternately on this tree and
on a base commit (default b722c79, checked out beside as a detached worktree), the same
command in both (a key renamed since is translated), so machine noise hits both.

Per run: wall seconds of the whole process (interpreter start to exit), its peak RSS
(the child's own rusage; it counts the shared libraries' resident pages, ~30 MiB more right
after `pip install` wrote them than once they are read back from disk: the README's
Simulator speed), simulated steps and requests per wall second, and start-up:
seconds from spawning the process until the driver's run() is entered (imports, config,
trace, scheduler and cost model built; the first step is next), with the modules' bytecode
cached as Python caches it by default (compileall over each tree's testbed/ and policies/ first;
pip compiles the packages' own at install). Start-up is stamped by a
two-line wrapper (STARTUP_WRAPPER) that both trees are run through, so it is measured the
same way on a commit that logs no such time. Medians per tree and the ratio this / base of
each figure go to benchmarks/results/sim_speed.json, or --out (with --only, the other workloads'
entries already there are kept). Against another base than b722c79, give another --out: the
committed file is the issue's pairing with b722c79.

    python benchmarks/bench_sim.py [--repeats 3] [--only vidur] [--base-commit b722c79] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sim_speed.json"

# the "Done when" workloads, in this tree's names
WORKLOADS = {
    # Vidur's workload: 4,000 ShareGPT requests, Poisson 2 req/s, Llama-3-8B on an A100, prefill-first
    "vidur": ["hardware=a100", "model=llama3_8b", "trace=sharegpt", "trace.num_requests=4000", "trace.rate=2",
              "seed=42", "policy=prefill_first", "scheduler.max_running=128", "policy.max_prefill_tokens=4096"],
    # the README's main job (1,000 ShareGPT requests at 4 req/s, chunked, H200)
    "readme": ["policy=chunked", "trace=sharegpt"],
    # every row of the bundled ShareGPT trace (30,731), Poisson 8 req/s, chunked, 256 running
    "sharegpt_full": ["policy=chunked", "trace=sharegpt", "trace.num_requests=0", "trace.rate=8",
                      "scheduler.max_running=256"],
    # a big-memory deployment: 100,000 synthetic requests, up to 1,000 running (a KV pool of 2M
    # tokens holds them all at full reservation), prefill-first so every running request decodes
    "synthetic_100k": ["trace=synthetic", "trace.num_requests=100000", "trace.rate=150", "policy=prefill_first",
                       "scheduler.max_running=1000", "engine.num_pages=2000000"],
}
# keys renamed since b722c79: this tree's name -> the old name, for a base tree without the
# new one (its config has no `scheduler` limits)
BASE_NAMES = {"scheduler.max_running": "policy.max_running"}

# Runs `python -m testbed.run ARGS` with SimDriver.run stamped: the wall clock when the first
# step is about to run goes to $BENCH_SIM_STARTUP (both trees have testbed.sim.driver.SimDriver).
STARTUP_WRAPPER = """\
import os, runpy, sys, time
import testbed.sim.driver as d
_run = d.SimDriver.run
def run(self):
    with open(os.environ["BENCH_SIM_STARTUP"], "w") as f:
        f.write(repr(time.time()))
    return _run(self)
d.SimDriver.run = run
sys.argv[0] = "testbed.run"
runpy.run_module("testbed.run", run_name="__main__", alter_sys=True)
"""


def base_overrides(overrides: list[str], base: Path) -> list[str]:
    """The overrides in the base tree's names: renamed keys translated only where the base
    predates the rename (a base of this tree's age takes them as they are)."""
    if "scheduler: SchedulerLimits" in (base / "testbed" / "config.py").read_text():
        return list(overrides)
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        out.append(f"{BASE_NAMES.get(key, key)}{eq}{value}")
    return out


def ensure_base(commit: str, path: Path) -> Path:
    """A detached worktree of `commit` at `path` (made if missing)."""
    if not (path / "testbed" / "run.py").is_file():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True, text=True)
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    want = subprocess.run(["git", "-C", str(ROOT), "rev-parse", commit], check=True, capture_output=True,
                          text=True).stdout.strip()
    if head != want:
        raise SystemExit(f"error: {path} is at {head[:10]}, not {commit}; remove it or give --base-dir")
    return path


def run_once(tree: Path, overrides: list[str], tmp: Path) -> dict:
    """One whole process of the simulator in `tree`; its figures."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    stamp = out / "startup"
    argv = [sys.executable, "-c", STARTUP_WRAPPER, *overrides, "progress=false", f"hydra.run.dir={out / 'run'}"]
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_SIM_STARTUP": str(stamp)}
    log = (out / "stderr").open("w+")
    t_spawn = time.time()
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=log)
    _, status, usage = os.wait4(p.pid, 0)  # the child's own rusage (its peak RSS); Popen.wait would reap it first
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        log.seek(0)
        raise SystemExit(f"error: run in {tree} failed (exit {p.returncode}): "
                         f"{(log.read().strip().splitlines() or ['?'])[-1]}\n  {' '.join(overrides)}")
    log.close()
    summary = json.loads((out / "run" / "summary.json").read_text())
    if not summary.get("complete"):
        raise SystemExit(f"error: run in {tree} incomplete: {summary.get('error')}")
    import pyarrow.parquet as pq
    steps = pq.read_metadata(out / "run" / "steps.parquet").num_rows
    nreq = summary["trace"]["num_requests"]
    return {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024,
            "startup_s": float(stamp.read_text()) - t_spawn, "loop_s": summary["wall_time_s"],
            "steps": steps, "requests": nreq, "completed": summary["metrics"]["completed"],
            "steps_per_s": steps / wall, "requests_per_s": nreq / wall}


def median_of(runs: list[dict]) -> dict:
    keys = ("wall_s", "peak_mib", "startup_s", "loop_s", "steps_per_s", "requests_per_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each workload in each tree")
    ap.add_argument("--only", action="append", choices=sorted(WORKLOADS), help="run only this workload (repeatable)")
    ap.add_argument("--base-commit", default="b722c79")
    ap.add_argument("--base-dir", type=Path, default=None, help="its worktree (made if missing; default /tmp/<commit>)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results JSON (its other workloads' entries are kept)")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")
    base = ensure_base(a.base_commit, (a.base_dir or Path("/tmp") / a.base_commit).resolve())
    results = json.loads(a.out.read_text()) if a.out.is_file() else {}
    this = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    today = datetime.date.today().isoformat()
    results.update({"machine": f"2-core x86 VM ({platform.machine()}, {os.cpu_count()} CPUs)",
                    "base_commit": a.base_commit, "this_commit": this, "date": today,
                    "bytecode": "cached (python -m compileall testbed policies in each tree first)"})
    workloads = results.setdefault("workloads", {})
    with tempfile.TemporaryDirectory() as tmp:
        # their own modules' bytecode, as a user's second run finds it (this VM sets
        # PYTHONDONTWRITEBYTECODE: every run would compile every module of the tree)
        for tree in (base, ROOT):
            subprocess.run([sys.executable, "-m", "compileall", "-q", "testbed", "policies"], cwd=tree, check=True)
        for name in a.only or list(WORKLOADS):
            ours, theirs = WORKLOADS[name], base_overrides(WORKLOADS[name], base)
            runs = {"base": [], "this": []}
            for i in range(a.repeats):  # alternately, so that noise hits both trees alike
                for side, tree, ov in (("base", base, theirs), ("this", ROOT, ours)):
                    r = run_once(tree, ov, Path(tmp))
                    runs[side].append(r)
                    print(f"{name} {side} #{i + 1}: {r['wall_s']:.2f} s wall, {r['peak_mib']:.0f} MiB, "
                          f"start-up {r['startup_s']:.2f} s, {r['steps_per_s']:,.0f} steps/s", flush=True)
            med = {side: median_of(rs) for side, rs in runs.items()}
            ratio = {k: med["this"][k] / med["base"][k] for k in med["this"] if med["base"][k]}
            workloads[name] = {"command": "python -m testbed.run " + " ".join(ours),
                               "command_base": "python -m testbed.run " + " ".join(theirs),
                               "repeats": a.repeats, "runs": runs, "median": med, "ratio_this_to_base": ratio,
                               "this_commit": this, "date": today}  # with --only, the others keep theirs
            print(f"{name}: this {med['this']['wall_s']:.2f} s / base {med['base']['wall_s']:.2f} s = "
                  f"{ratio['wall_s']:.3f} of the wall time; peak {med['this']['peak_mib']:.0f} vs "
                  f"{med['base']['peak_mib']:.0f} MiB; start-up {med['this']['startup_s']:.2f} vs "
                  f"{med['base']['startup_s']:.2f} s", flush=True)
            a.out.write_text(json.dumps(results, indent=2) + "\n")  # after each workload: a long run keeps what is done
    return 0


if __name__ == "__main__":
    sys.exit(main())
