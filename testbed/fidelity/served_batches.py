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


def simulated_batches(deployment: list[str], policies=POLICIES, requests: int = REQUESTS, keep=None
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every step of each policy's runs on TRACES at LOADS whose extend lengths `keep` takes
    (default: the mixed steps). deployment: the overrides naming the model, hardware and engine
    limits (model=..., hardware=...)."""
    from testbed.fidelity.batches import is_mixed, step_batches
    from testbed.fidelity.cells import native_rate
    keep = keep or is_mixed
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
                out += [b for b in step_batches(reqs, steps) if b is not None and keep(b[0])]
    return out


def pick(batches, n: int, fa) -> list[tuple[np.ndarray, np.ndarray]]:
    """About n of the batches, spread: each fa2 plan group (fit.local_features) gets a share of n
    by the square root of its count (one at least: a rare group is where a fit over the common
    ones errs), and within it farthest-point sampling over its places, from the batch nearest
    the group's median place."""
    from testbed.sim.costmodel.fit import local_features
    return _spread(batches, [local_features(e, c, fa) for e, c in batches], n)


def pick_decodes(batches, n: int, graph_sizes) -> list[tuple[np.ndarray, np.ndarray]]:
    """pick for decode-only batches: grouped by the CUDA graph that runs them (the smallest
    size that holds the rows; 0 beyond the largest: eager), placed by log2 of the rows, the KV
    tokens and the longest context."""
    sizes = np.asarray(sorted(graph_sizes), np.int64)

    def where(e, c):
        b = len(e)
        i = int(np.searchsorted(sizes, b))
        ctx = np.asarray(c, np.int64) + 1
        return (int(sizes[i]) if i < len(sizes) else 0,), np.array(
            [math.log2(b), math.log2(int(ctx.sum())), math.log2(int(ctx.max()))])
    return _spread(batches, [where(e, c) for e, c in batches], n)


def _spread(batches, located, n: int):
    """n of the batches by their (group, place): shares by the square root of each group's
    count, farthest-point sampling within a group."""
    if n <= 0 or not batches:
        return []
    groups: dict[tuple, list[int]] = {}
    for i, (g, _) in enumerate(located):
        groups.setdefault(g, []).append(i)
    places = np.array([x for _, x in located])
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
