"""Simulator against engine, one cell: the serving metrics' relative errors, the engine's
own run-to-run spread, and the step times by kind."""
from __future__ import annotations

import numpy as np
import pandas as pd

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e_latency", "E2E"))
STATS = ("mean", "median", "p90", "p99")
#: what the acceptance bar is set on: mean and p90 of TTFT, TPOT and E2E, and throughput
HEADLINE = ("mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "p90_tpot_ms", "mean_e2e_latency_ms",
            "p90_e2e_latency_ms", "output_throughput")
METRICS = tuple(f"{s}_{k}_ms" for k, _ in LATENCIES for s in STATS) + ("output_throughput", "request_throughput")


def label(metric: str) -> str:
    if metric.endswith("_throughput"):
        return metric.replace("_", " ")
    stat, rest = metric.split("_", 1)
    name = dict(LATENCIES)[rest[:-3]]
    return f"{stat} {name}"


def cell_errors(engine: list[dict], sim: dict) -> dict:
    """engine: the runs' summary metrics; sim: the simulator's. Errors are relative to the
    mean of the engine runs; spread is (max - min) / mean over the engine runs."""
    out = {}
    for m in METRICS:
        ev = [e.get(m) for e in engine]
        sv = sim.get(m)
        if any(v is None for v in ev) or sv is None:
            continue
        ref = float(np.mean(ev))
        out[m] = {"engine": ev, "sim": sv, "error": sv / ref - 1 if ref else None,
                  "spread": (max(ev) - min(ev)) / ref if ref and len(ev) > 1 else None}
    return out


def step_kinds(steps: pd.DataFrame) -> pd.Series:
    return np.where(steps["prefill_reqs"] > 0, np.where(steps["decode_reqs"] > 0, "mixed", "prefill"), "decode")


def step_table(engine_steps: pd.DataFrame, sim_steps: pd.DataFrame) -> pd.DataFrame:
    """Mean step time by kind in the engine run and in the simulation: the interval each step
    adds to the timeline (end to end), its device time and its host parts (ms)."""
    rows = []
    for who, s in (("engine", engine_steps), ("sim", sim_steps)):
        s = s.sort_values("step").assign(kind=lambda d: step_kinds(d), interval=lambda d: d["end_s"].diff())
        for kind, g in s.groupby("kind"):
            rows.append({"who": who, "kind": kind, "steps": len(g), "batch": g["batch_reqs"].mean(),
                         **{c: g[c].mean() * 1e3 for c in ("interval", "duration_s", "host_s", "launch_s",
                                                             "complete_s")}})
    return pd.DataFrame(rows)
