"""Bisection for the highest rate that meets a target, given `measure(rate, role) -> attainment`.

The bracket is narrowed on log(rate) (the midpoint of low and high is sqrt(low * high)), so
each step halves the ratio high / low and the answer is as precise at 0.5 req/s as at 50.
The invariant: the lower end was measured meeting the target and the upper end missing it,
so the answer, the highest rate tried that meets, has the rate tried just above it missing
even when attainment is not monotone in the rate (a finite trace is noisy)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

FOUND, BELOW_LOW, AT_HIGH = "found", "below_low", "at_high"


@dataclass
class Answer:
    status: str  # FOUND, BELOW_LOW (even the lowest rate misses), AT_HIGH (the highest rate still meets)
    rate: float | None  # the highest rate tried that meets the target; None when even `low` misses
    above: float | None  # the lowest rate tried above it, which misses; None when `high` still meets


def midpoint(lo: float, hi: float) -> float:
    """sqrt(lo * hi), kept to 4 significant digits (the rates name run directories)."""
    return float(f"{math.sqrt(lo * hi):.4g}")


def bisect(measure: Callable[[float, str], float], low: float, high: float, iterations: int,
           target: float) -> Answer:
    """measure(rate, role) -> attainment, role 'low', 'high' or 'bisect k/n'. Tries low first
    (when it misses, nothing above is tried), then high (when it meets, there is nothing to
    narrow), then up to `iterations` midpoints; stops early when a midpoint rounds onto an end."""
    if measure(low, "low") < target:
        return Answer(BELOW_LOW, None, low)
    if measure(high, "high") >= target:
        return Answer(AT_HIGH, high, None)
    lo, hi = low, high
    for k in range(iterations):
        mid = midpoint(lo, hi)
        if not lo < mid < hi:
            break
        if measure(mid, f"bisect {k + 1}/{iterations}") >= target:
            lo = mid
        else:
            hi = mid
    return Answer(FOUND, lo, hi)
