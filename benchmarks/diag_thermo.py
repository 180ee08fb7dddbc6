"""Is the GPU machine's host speed during an engine run measurable from outside the engine?

A side process (the thermometer) times a fixed pure-Python workload every 10 ms on another
core while fidelity cells run on the engine; before each run the same workload is timed in
the engine's own process. Writes per run: the thermometer's median during the run, the
in-process median before it, and the run's steps.parquet (the host time per step, to set
against the profile's host fit offline). With `profile=1`, one more run of the first cell
under cProfile: where the engine's host time goes.

    python benchmarks/diag_thermo.py [cells=a,b,c] [repeats=2] [profile=1] --out DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from diag_cell import ROOT, pop_out

DEFAULT = "qwen3_0_6b-chunked-azure_conv-light,qwen3_0_6b-prefill_first-azure_conv-high,qwen3_0_6b-decode_first-sharegpt-light"


def workload() -> None:
    """~0.3-0.5 ms of interpreter work: dicts, lists, small numpy calls (what the engine's host does)."""
    import numpy as np
    d = {i: i * 3 for i in range(200)}
    s = sorted(d.values(), reverse=True)
    t = sum(x % 7 for x in s)
    a = np.arange(64)
    for _ in range(20):
        a = np.cumsum(a % 5)
    return t + int(a[-1])


def probe_median(n: int = 200) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        workload()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def thermometer(path: str) -> None:
    """The side process: (time, workload seconds) every 10 ms until killed."""
    with open(path, "w") as f:
        while True:
            t0 = time.perf_counter()
            workload()
            f.write(f"{t0:.6f} {time.perf_counter() - t0:.7f}\n")
            f.flush()
            time.sleep(0.01)


def main(argv):
    out, argv = pop_out(argv)
    args = dict(a.split("=", 1) for a in argv)
    if args.get("thermometer"):
        thermometer(args["thermometer"])
        return 0
    import numpy as np

    from testbed import assemble
    from testbed.config import compose
    from testbed.fidelity.cells import read_plan
    from testbed.run import run

    out.mkdir(parents=True, exist_ok=True)
    names = args.get("cells", DEFAULT).split(",")
    repeats = int(args.get("repeats", 2))
    plan = {c.name: c for c in read_plan(ROOT / "benchmarks/results/fidelity/plan.json")}
    cells = [plan[n] for n in names]
    info = {}
    for cmd in ("nproc", "cat /proc/loadavg", "cat /sys/fs/cgroup/cpu.max", "cat /sys/fs/cgroup/cpu.stat",
                "lscpu", "uname -r", "grep MHz /proc/cpuinfo | head -4", "nvidia-smi topo -m"):
        info[cmd] = subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()[:3000]
    therm_path = out / "thermometer.txt"
    side = subprocess.Popen([sys.executable, __file__, f"thermometer={therm_path}"])
    runs = []
    try:
        cfg = compose(cells[0].overrides + ["backend=engine"])
        parts = assemble.engine_parts(cfg)
        for k in range(repeats):
            for cell in cells:
                cfg = compose(cell.overrides + ["backend=engine"])
                inproc = probe_median()
                d = out / f"{cell.name.split('-', 1)[1]}-r{k + 1}"
                t0 = time.perf_counter()
                s = run(cfg, str(d), engine_parts=parts, keep_ids=False, print_table=False)
                t1 = time.perf_counter()
                runs.append({"cell": cell.name, "r": k + 1, "t0": t0, "t1": t1, "inproc_probe_s": inproc,
                             "mean_ttft_ms": s["metrics"]["mean_ttft_ms"], "mean_tpot_ms": s["metrics"]["mean_tpot_ms"]})
                print(json.dumps(runs[-1]), flush=True)
        if args.get("profile"):
            import cProfile
            import pstats
            cfg = compose(cells[0].overrides + ["backend=engine"])
            pr = cProfile.Profile()
            with tempfile.TemporaryDirectory() as d:
                pr.enable()
                run(cfg, d, engine_parts=parts, keep_ids=False, print_table=False)
                pr.disable()
            with open(out / "cprofile.txt", "w") as f:
                st = pstats.Stats(pr, stream=f)
                st.sort_stats("tottime").print_stats(45)
                st.sort_stats("cumulative").print_stats(60)
    finally:
        side.kill()
    samples = np.loadtxt(therm_path)
    for r in runs:
        sel = samples[(samples[:, 0] >= r["t0"]) & (samples[:, 0] <= r["t1"]), 1]
        r["thermo_probe_s"] = float(np.median(sel)) if len(sel) else None
        r["thermo_n"] = int(len(sel))
    (out / "thermo.json").write_text(json.dumps({"info": info, "runs": runs}, indent=1) + "\n")
    for r in runs:
        print(r["cell"], r["r"], f"in-process {1e3 * r['inproc_probe_s']:.3f} ms, side {1e3 * (r['thermo_probe_s'] or 0):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
