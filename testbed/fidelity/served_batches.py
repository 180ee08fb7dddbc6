"""Mixed batches as a deployment's policies serve them: the step profiler's `served batch`
shapes, taken from the simulator.

A served batch replayed alone on the engine runs as long as it did served (to a median 0.4%
on the H200: benchmarks/results/fidelity/experiments/README.md), so measuring the batches the
policies build is the way to price them; the grid's families of rows around a chunk (uniform,
spread, skewed, served) miss the shapes where the eager fit is 5-10% off. The simulator builds
them: each policy on the bundled traces (Poisson ShareGPT, Azure conversations' and Mooncake
conversations' timestamps compressed) at 60% and 90% of its capacity, with the deployment's
cost model (calibrated when it has a profile, else the roofline: the batches' shapes follow
the scheduling, not the exact step times). Their requests are the fidelity experiment's
cells' in part only: ShareGPT's rows are drawn in another order (`SEED`); the timestamped
traces' first `REQUESTS` hold the cells' first 40-442, replayed at other compressions. From
every mixed step of those runs, `pick` keeps a spread: per fa2 plan group
(fit.local_features) a share of `n`, by farthest-point sampling over the group's places."""
from __future__ import annotations

import math
import tempfile
import warnings
from pathlib import Path

import numpy as np

POLICIES = ("chunked", "decode_first")  # the policies that put a chunk beside decodes
TRACES = ("sharegpt", "azure_conv", "mooncake_conversation")
LOADS = (0.6, 0.9)
TIMESTAMPED = ("azure_conv", "mooncake_conversation")
SEED = 7
REQUESTS = 600
CAPACITY_REQUESTS = 300


def _run(overrides: list[str]):
    """(summary, requests frame, steps frame) of one simulator run."""
    import pandas as pd

    from testbed.config import compose
    from testbed.run import run
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        # the cost model's notes on steps beyond its profiled range: these runs are for the
        # batches' shapes, which the scheduling sets, not for their times
        warnings.simplefilter("ignore", UserWarning)
        s = run(compose(overrides), d, print_table=False)
        return s, pd.read_parquet(Path(d) / "requests.parquet"), pd.read_parquet(Path(d) / "steps.parquet")


def simulated_batches(deployment: list[str], policies=POLICIES, requests: int = REQUESTS
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every mixed step (a chunk beside decodes) of each policy's runs on TRACES at LOADS.
    deployment: the overrides naming the model, hardware and engine limits (model=..., hardware=...)."""
    from testbed.fidelity.batches import step_batches
    from testbed.fidelity.cells import native_rate
    out = []
    for policy in policies:
        for trace in TRACES:
            base = [*deployment, f"policy={policy}", f"trace={trace}", f"seed={SEED}", "backend=sim",
                    "progress=false"]
            stamp = trace in TIMESTAMPED
            cap, _, _ = _run(base + [f"trace.num_requests={CAPACITY_REQUESTS}",
                                     "trace.time_scale=1e-9" if stamp else "trace.rate=inf"])
            capacity = cap["metrics"]["request_throughput"]
            native = native_rate(base, requests) if stamp else None
            for load in LOADS:
                rate = load * capacity
                pace = f"trace.time_scale={native / rate:.6g}" if stamp else f"trace.rate={rate:.6g}"
                _, reqs, steps = _run(base + [f"trace.num_requests={requests}", pace])
                for b in step_batches(reqs, steps):
                    if b is not None and (b[0] == 1).any() and (b[0] > 1).any():
                        out.append(b)
    return out


def pick(batches, n: int, fa) -> list[tuple[np.ndarray, np.ndarray]]:
    """About n of the batches, spread: each fa2 plan group (fit.local_features) gets a share of n
    by the square root of its count (one at least: a rare group is where a fit over the common
    ones errs), and within it farthest-point sampling over its places, from the batch nearest
    the group's median place."""
    from testbed.sim.costmodel.fit import local_features
    if n <= 0 or not batches:
        return []
    groups: dict[tuple, list[int]] = {}
    places = []
    for i, (e, c) in enumerate(batches):
        g, x = local_features(e, c, fa)
        groups.setdefault(g, []).append(i)
        places.append(x)
    places = np.array(places)
    chosen = []
    total = sum(math.sqrt(len(idx)) for idx in groups.values())
    for g, idx in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        share = max(1, round(n * math.sqrt(len(idx)) / total))
        pts = places[idx]
        first = int(np.argmin(((pts - np.median(pts, axis=0)) ** 2).sum(axis=1)))
        picked = [first]
        dist = np.sqrt(((pts - pts[first]) ** 2).sum(axis=1))
        while len(picked) < min(share, len(idx)) and dist.max() > 0:
            j = int(np.argmax(dist))
            picked.append(j)
            dist = np.minimum(dist, np.sqrt(((pts - pts[j]) ** 2).sum(axis=1)))
        chosen += [idx[j] for j in picked]
    return [batches[i] for i in sorted(chosen)]
