"""How long the host sat idle before each step of a run's steps.parquet: what makes a step
"woken" (the profile's wake factors and device time, testbed/sim/costmodel/fit.py), read
back from any run's step rows (the profiler's workloads, the fidelity report's engine runs)."""
from __future__ import annotations

import numpy as np


def idle_before(start_s, end_s, complete_s) -> np.ndarray:
    """Per step: how long the host sat idle before scheduling it (0 for the first step and for
    steps scheduled while another was in flight or being applied)."""
    start, end, comp = (np.asarray(a, float) for a in (start_s, end_s, complete_s))
    idle = np.zeros(len(start))
    if len(start) > 1:
        idle[1:] = np.maximum(start[1:] - (end[:-1] + comp[:-1]), 0.0)
    return idle
