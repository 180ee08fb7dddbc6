"""Seeded arrival times for traces that have none."""
from __future__ import annotations

import math

import numpy as np

from .streams import ARRIVALS


def synthesize_arrivals(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """n arrival times (s): the first at t=0, then Gamma gaps with shape `burstiness` and
    mean 1/rate (shape 1 is a Poisson process; the gaps' CV is 1/sqrt(burstiness)).
    rate=inf puts every arrival at t=0. The first k times do not depend on n."""
    if n <= 0:
        return np.zeros(0, dtype=np.float64)
    if math.isinf(rate):
        return np.zeros(n, dtype=np.float64)
    rng = np.random.default_rng([seed, ARRIVALS])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    out = np.empty(n, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(gaps, out=out[1:])
    return out


def describe_arrivals(rate: float, burstiness: float, seed: int) -> str:
    if math.isinf(rate):
        return "arrivals synthesized: rate inf, every request at t=0"
    if burstiness == 1.0:
        shape = "Poisson"
    else:
        shape = f"Gamma shape {burstiness:g} (gap CV {1 / math.sqrt(burstiness):.3g})"
    return f"arrivals synthesized: {shape} {rate:g} req/s seed {seed}, first at t=0"
