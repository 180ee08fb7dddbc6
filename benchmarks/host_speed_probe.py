"""How fast and how steady a machine's cores run the engine's kind of host work (Python
object and small-list work, as a scheduler step does), per core and over time.

    python benchmarks/host_speed_probe.py [--seconds 20] [--out FILE]

The fidelity runs' host time per step switched between two levels ~1.6x apart within one run
(decode steps of the same batch size at ~400 and ~650 us, on the H200 VM): this measures
whether that follows the core the process runs on (a per-core sweep, each core pinned in
turn) or the time (one core pinned, timed every few ms; then unpinned, with the core it ran
on read from /proc at each sample). Writes a JSON record (machine, per-core medians, the
time series' levels); prints a summary."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path


def work(n: int = 300) -> int:
    """A scheduler step's kind of work: small objects, dict and list traffic, a sort."""
    rows = [{"id": i, "len": (i * 7919) % 1021, "state": i & 3} for i in range(n)]
    by = {}
    for r in rows:
        by.setdefault(r["state"], []).append(r)
    rows.sort(key=lambda r: (r["state"], -r["len"]))
    return sum(r["len"] for r in rows[: n // 2]) + len(by)


def timed(repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def current_cpu() -> int:
    """The core this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def siblings() -> dict:
    out = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        out[cpu] = p.read_text().strip() if p.exists() else None
    return out


def series(seconds: float, pin: int | None, gap_s: float = 0.002) -> list[tuple[float, float, int]]:
    """(t, work time, core) every gap_s for `seconds`: a busy loop with short sleeps, as the engine's."""
    allowed = os.sched_getaffinity(0)
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    out, t_end = [], time.perf_counter() + seconds
    try:
        while time.perf_counter() < t_end:
            out.append((time.perf_counter(), timed(3), current_cpu()))
            time.sleep(gap_s)
    finally:
        os.sched_setaffinity(0, allowed)
    return out


def levels(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=20)
    return {"p5_us": q[0] * 1e6, "p50_us": statistics.median(xs) * 1e6, "p95_us": q[-1] * 1e6,
            "p95_over_p5": q[-1] / q[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0, help="each time series' length")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    timed(200)  # warm the interpreter's caches
    per_core = {}
    for rnd in range(3):  # three sweeps: a core's speed, and whether it holds
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            per_core.setdefault(cpu, []).append(timed(50) * 1e6)
    os.sched_setaffinity(0, set(allowed))
    pinned = series(a.seconds, allowed[len(allowed) // 2])
    free = series(a.seconds, None)
    rec = {
        "machine": {"node": platform.node(), "cpus": allowed, "siblings": siblings(),
                    "python": platform.python_version()},
        "per_core_us": {str(c): [round(x, 1) for x in v] for c, v in per_core.items()},
        "pinned": {"core": allowed[len(allowed) // 2], **levels([s[1] for s in pinned]), "samples": len(pinned)},
        "unpinned": {**levels([s[1] for s in free]), "samples": len(free),
                     "cores_seen": sorted({s[2] for s in free}),
                     "by_core_p50_us": {str(c): statistics.median([s[1] for s in free if s[2] == c]) * 1e6
                                        for c in sorted({s[2] for s in free})}},
        "series": {"pinned": [(round(t - pinned[0][0], 4), round(w * 1e6, 1)) for t, w, _ in pinned[::10]],
                   "unpinned": [(round(t - free[0][0], 4), round(w * 1e6, 1), c) for t, w, c in free[::10]]},
    }
    print("per core, us (3 sweeps):", {c: v for c, v in rec["per_core_us"].items()})
    print("pinned  :", {k: round(v, 2) for k, v in rec["pinned"].items() if k != "core"}, "core", rec["pinned"]["core"])
    print("unpinned:", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in rec["unpinned"].items()
                        if k != "by_core_p50_us"})
    print("unpinned by core p50 us:", {c: round(v, 1) for c, v in rec["unpinned"]["by_core_p50_us"].items()})
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"written {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
