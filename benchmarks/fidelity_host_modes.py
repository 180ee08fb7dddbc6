"""The engine host's speed over time (issue #11): whether it moves with the CPU the engine runs
on, with time the hypervisor steals, or with neither.

A fidelity run's host speed (the report's column: the engine's host time per step over the
profile's host fit) is a median over the run. Here it is taken per window of a run (0.5 s), which
shows whether the host runs at one speed or switches between speeds, and, with the samples of
`sample`, what the engine's main thread and its CPU did in each window.

On the GPU machine, the engine side of a few cells with the sampler beside it (every 50 ms: the
CPU of the process's main thread, that CPU's /proc/stat line, the main thread's /proc/<pid>/schedstat):

    python benchmarks/fidelity_host_modes.py sample DIR/samples.txt -- \\
        python -m testbed.fidelity engine out=DIR repeats=2 cells=A,B
    # `taskset -c N` before `python -m` pins every thread of the engine to one CPU

then anywhere (no GPU):

    python benchmarks/fidelity_host_modes.py analyse DIR [--write FILE]

A window is `S` (slow) when its median step took over 1.25x the host fit, `F` (fast) under
1.05x, `-` between; the sampler's clock is CLOCK_MONOTONIC, the clock of the runs' timelines
(summary.json's clock_origin_s)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WINDOW_S = 0.5
SLOW, FAST = 1.25, 1.05
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def sample(out: Path, cmd: list[str], every_s: float = 0.05) -> int:
    """Run `cmd`, writing a JSON line every `every_s` until it exits; returns its exit status."""
    out.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(cmd)
    with out.open("w") as f:
        while p.poll() is None:
            try:
                stat = Path(f"/proc/{p.pid}/stat").read_text()
                cpu = int(stat[stat.rindex(")") + 2:].split()[36])  # field 39, after the (comm)
                on_ns, wait_ns, slices = map(int, Path(f"/proc/{p.pid}/schedstat").read_text().split())
                line = next((ln for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith(f"cpu{cpu} ")), "")
            except (FileNotFoundError, ProcessLookupError, ValueError):
                break  # the process ended between poll() and the reads
            ticks = dict(zip(STAT_FIELDS, map(int, line.split()[1:9])))  # none for a CPU /proc/stat lacks
            f.write(json.dumps({"t": time.monotonic(), "cpu": cpu, "oncpu_ns": on_ns, "runq_wait_ns": wait_ns,
                                "slices": slices, **ticks}) + "\n")
            time.sleep(every_s)
    return p.wait()


def run_windows(run: Path, cost, samples: pd.DataFrame | None) -> pd.DataFrame:
    """A row per window of one run: its steps' median host speed and, with samples, the CPU the
    engine's main thread was on, that CPU's steal and idle ticks, and the thread's run-queue wait."""
    from testbed.fidelity.report import step_host_ratios  # the report's host-speed column, per step
    s = pd.read_parquet(run / "steps.parquet")
    ratio = step_host_ratios(s, cost)
    win = (s["start_s"].to_numpy() // WINDOW_S).astype(int)
    g = pd.DataFrame({"window": win, "ratio": ratio, "reqs": s["batch_reqs"].to_numpy()}).groupby("window")
    w = g.agg(steps=("ratio", "size"), host_speed=("ratio", "median"), median_batch=("reqs", "median")).reset_index()
    w["t_s"] = w["window"] * WINDOW_S
    if samples is not None:
        origin = json.loads((run / "summary.json").read_text())["clock_origin_s"]
        extra = []
        for t0 in origin + w["t_s"].to_numpy():
            m = samples[(samples["t"] >= t0) & (samples["t"] < t0 + WINDOW_S)]
            if len(m) < 2:
                extra.append({"cpu": None, "steal_ticks": None, "idle_ticks": None, "runq_wait_frac": None})
                continue
            d = m.iloc[-1] - m.iloc[0]
            extra.append({"cpu": int(m["cpu"].mode().iat[0]), "steal_ticks": d.get("steal"), "idle_ticks": d.get("idle"),
                          "runq_wait_frac": d["runq_wait_ns"] / 1e9 / d["t"] if "runq_wait_ns" in d else None})
        w = pd.concat([w, pd.DataFrame(extra)], axis=1)
    return w.drop(columns="window")


def modes(host_speed) -> str:
    return "".join("S" if v > SLOW else "F" if v < FAST else "-" for v in host_speed)


def analyse(d: Path, write: Path | None) -> None:
    from testbed.fidelity.cells import read_plan
    from testbed.fidelity.report import cell_cost_model, engine_runs
    f = d / "samples.txt"
    samples = pd.read_json(f, lines=True) if f.is_file() else None
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cost model's out-of-range notes
        for cell in read_plan(d / "plan.json"):
            for k, run in enumerate(engine_runs(d, cell), 1):
                w = run_windows(run, cell_cost_model(run, cell), samples)
                seq = modes(w["host_speed"])
                print(f"{cell.name:<55} r{k} host speed {np.median(w['host_speed']):.2f}  {seq}")
                if samples is not None:
                    cpus = "".join(str(c)[-1] if c is not None else "?" for c in w["cpu"])
                    steal = w["steal_ticks"].dropna()
                    print(f"{'':<55}    cpu (last digit)  {cpus}" + (f"   steal ticks {int(steal.sum())}" if len(steal) else ""))
                out.append({"cell": cell.name, "run": k, "modes": seq, "windows": w.to_dict("records")})
    if write:
        write.write_text(json.dumps({"window_s": WINDOW_S, "slow_over": SLOW, "fast_under": FAST, "runs": out}, indent=1) + "\n")
        print(f"written {write}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sample"]:
        if len(argv) < 4 or argv[2] != "--":
            raise SystemExit("usage: fidelity_host_modes.py sample FILE -- CMD ...")
        return sample(Path(argv[1]), argv[3:])
    ap = argparse.ArgumentParser(usage="fidelity_host_modes.py analyse DIR [--write FILE] | sample FILE -- CMD ...")
    ap.add_argument("step", choices=["analyse"])
    ap.add_argument("dir", type=Path, help="a fidelity directory with plan.json and runs/ (and samples.txt)")
    ap.add_argument("--write", type=Path, default=None, help="JSON to write (default: print only)")
    a = ap.parse_args(argv)
    analyse(a.dir, a.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
