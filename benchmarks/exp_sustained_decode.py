"""Experiment (issues #11, #17): is a decode step slower when the GPU runs steps back to back
than when it is timed alone, as the step profiler times it?

The fidelity runs' CUDA-graph decode steps of 33+ rows are priced 1-4% short on every machine
start, while the same batches timed alone come within about 1%, and the shortfall is there from
a run's first seconds (benchmarks/results/fidelity/experiments/README.md). The profiler times a
shape by holding the device with a sleep kernel, then one step, then a sync: the GPU idles (at
low power) between steps. A serving run keeps it busy. If a large step draws enough power to pull
the SM clock down within milliseconds, it runs slower back to back than alone.

For each batch size (one context for every row, 20% of it interleaved as the profiler lays decode
rows out), and the same decode rows beside a fresh prompt chunk of `--mixed-chunk` tokens (an eager
step, as decode_first serves a new prompt beside 100+ decodes; at most max_running - 1 decode rows,
the prompt takes a row; 0: none), and round, in turn:
- `alone`: time_host_batch, as the profiler times a shape (median of `--repeats`);
- `sustained`: `--steps` steps launched as the serving loop launches them (the next step
  enqueued before the previous one is collected, so the device never waits), median of the last
  two thirds and of the first ten;
- `alone_after`: time_host_batch again right after.
A side `nvidia-smi` samples the SM clock and power every 20 ms; each phase gets their medians.
GPU only (`--set engine.device=cpu ...` runs it on the CPU reference engine, for the test, with no
clock sampling).

    python benchmarks/exp_sustained_decode.py --model qwen3_0_6b --out FILE [--batches 8,32,...]
        [--context 700] [--mixed-chunk 256] [--steps 300] [--rounds 2] [--set KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sustained(ex, hb, steps: int) -> list[float]:
    """Device time of each of `steps` back-to-back steps of one batch, launched one ahead."""
    from testbed.engine.synthetic_batch import greedy_sampling
    sampling = greedy_sampling(hb.fb.batch_size)
    out, prev = [], ex.launch_host(hb, sampling)
    for _ in range(steps - 1):
        h = ex.launch_host(hb, sampling)
        out.append(ex.collect(prev).duration)
        prev = h
    out.append(ex.collect(prev).duration)
    return out


class ClockLog:
    """nvidia-smi's SM clock and power every 20 ms, with wall-clock stamps, into a file."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp()) / "clocks.csv"
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                 "-lms", "20"], stdout=self.path.open("w"), stderr=subprocess.DEVNULL)

    def stop(self) -> list[tuple[float, float, float]]:
        if self.proc is None:
            return []
        self.proc.terminate()
        self.proc.wait()
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                ts, sm, pw = (x.strip() for x in line.split(","))
                t = time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1])
                rows.append((t, float(sm), float(pw)))
            except (ValueError, IndexError):
                continue  # a line cut by terminate
        return rows


def during(samples, t0: float, t1: float) -> dict:
    sel = [(sm, pw) for t, sm, pw in samples if t0 <= t <= t1]
    if not sel:
        return {}
    sm, pw = np.array(sel).T
    return {"sm_mhz": float(np.median(sm)), "power_w": float(np.median(pw)), "samples": len(sel)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--batches", default="8,32,64,96,128,160,192,256")
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--mixed-chunk", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from probe_engine import probe_engine
    from testbed.engine.profiler import DECODE_INTERLEAVE, time_host_batch
    from testbed.engine.synthetic_batch import synthetic_host_batch

    spec, s, parts, ex, cps = probe_engine(a.model, a.set)
    batches = [int(x) for x in a.batches.split(",")]
    shapes = {}  # (kind, decode rows) -> the step's batch
    for b in batches:
        dec_e, dec_c = np.ones(b, np.int64), np.full(b, a.context - 1, np.int64)
        m = min(b, s.max_running - 1)  # a mixed step's decode rows: the prompt takes a row too
        for kind, e, c in (("decode", dec_e, dec_c),
                           ("mixed", np.append(a.mixed_chunk, dec_e[:m]), np.append(0, dec_c[:m]))):
            if kind == "mixed" and a.mixed_chunk <= 0:
                continue
            shapes[kind, b] = synthetic_host_batch(e, c, parts.slots, s.page_size, spec.vocab_size,
                                                   interleave=DECODE_INTERLEAVE, pending=True)
    clocks = ClockLog()
    phases = []  # (kind, batch, round, phase, t0, t1, figures)
    try:
        for r in range(a.rounds):
            for (kind, b), hb in shapes.items():
                t0 = time.time()
                alone = time_host_batch(ex, hb, a.repeats, cps)["device_s"]
                t1 = time.time()
                d = sustained(ex, hb, a.steps)
                t2 = time.time()
                after = time_host_batch(ex, hb, a.repeats, cps)["device_s"]
                t3 = time.time()
                steady = float(np.median(d[len(d) // 3:]))
                n = {"rows": hb.fb.batch_size}
                phases += [(kind, b, r, "alone", t0, t1, {**n, "device_s": alone}),
                           (kind, b, r, "sustained", t1, t2, {**n, "device_s": steady, "first10_s": float(np.median(d[:10])),
                                                              "steps": len(d)}),
                           (kind, b, r, "alone_after", t2, t3, {**n, "device_s": after})]
                print(f"{kind} {b:4d} rows round {r}: alone {alone * 1e3:.3f} ms, sustained {steady * 1e3:.3f} ms "
                      f"({steady / alone:.3f}x; first ten {np.median(d[:10]) * 1e3:.3f}), after {after * 1e3:.3f}",
                      flush=True)
    finally:
        samples = clocks.stop()
        rows = [{"shape": k, "batch": b, "round": r, "phase": p, **fig, **during(samples, t0, t1)}
                for k, b, r, p, t0, t1, fig in phases]
        Path(a.out).write_text(json.dumps({"model": a.model, "context": a.context, "mixed_chunk": a.mixed_chunk,
                                           "steps": a.steps, "interleave": DECODE_INTERLEAVE, "rows": rows}, indent=1))
    for kind, b in shapes:
        sel = {p: [x for x in rows if (x["shape"], x["batch"], x["phase"]) == (kind, b, p)]
               for p in ("alone", "sustained")}
        ratio = np.median([y["device_s"] for y in sel["sustained"]]) / np.median([y["device_s"] for y in sel["alone"]])
        clk = {p: np.median([y["sm_mhz"] for y in v if "sm_mhz" in y] or [np.nan]) for p, v in sel.items()}
        print(f"{kind} {b:4d} rows: sustained / alone {ratio:.3f}; SM clock {clk['alone']:.0f} -> "
              f"{clk['sustained']:.0f} MHz")


if __name__ == "__main__":
    main()
