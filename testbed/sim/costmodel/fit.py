"""Fit a step profiler's measurements (testbed/engine/profiler.py) into the calibrated
cost model's profile (testbed/sim/costmodel/calibrated.py says what each part predicts).

* CUDA-graph decode, device: per captured size ``s``, NNLS of ``a_s + b_s * kv_tokens +
  i_s * imbalance`` (imbalance = s x the longest context - the KV tokens, padding rows
  included; the profiler's batches of unequal rows, and of fewer rows than the graph, tell it
  apart from the KV term). A decode batch runs in the
  smallest graph that holds it, so the size is exact, not interpolated: that is where the
  graph padding enters.
* Eager steps (a prefill chunk in the batch, or a decode batch beyond the graphs), device:
  ``base(tokens)``, a piecewise-linear curve through the single fresh prompt of each
  profiled token count (tokens padded to the piecewise CUDA graph's size that runs them,
  ``padded_tokens``: the profiled counts are sizes, so the curve's points are exact), plus
  non-negative coefficients (NNLS on relative error: fitted on seconds, the 100 ms prefills
  set them and 5-20 ms mixed steps over long prefixes came out 6% short) for what a batch
  has beyond one fresh prompt of the same tokens: attention work ``sum n_i (c_i + (n_i + 1) / 2)`` minus that prompt's, KV tokens read
  beyond the new ones, requests beyond one, imbalance, and the attention kernel's busiest-SM
  load per query tile (``fa2_load``). That last term carries mixed steps: flashinfer's
  batch-prefill plan gives a decode row beside a chunk a whole query tile of 16-128 rows, and
  the step takes as long as its busiest SM, not as its total work (``fa2_plan`` emulates the
  plan from the batch). A mixed step within reach of measured mixed shapes (the grid's, and
  those other machine starts measured: ``refit ... local_from=``) is then corrected by their
  residual over this fit (``LocalCorrection``): the linear fit's residuals follow the shape.
* Host, per step kind (decode-only or not): non-negative linear fits on the batch's
  requests, new tokens and KV tokens of ``host_s`` (schedule, batch build, upload),
  ``launch_s`` (enqueueing; its own fit for decode-graph, whole-step-graph and eager steps) and ``complete_s``, over
  every step of the profiler's host workloads (a batch workload and Poisson serving ones)
  that did not follow an idle gap: the typical step, by non-negative least absolute
  deviations (``median_nnls`` says why). Steps launched after the host sat idle for more than
  ``WAKE_GAP_S`` take longer on every host part (caches gone cold, the core woken): their
  median ``host_s`` and ``launch_s`` over the fit's prediction are the profile's wake factors
  (``fit_wake``), which the simulator applies to a step it launches after an idle gap. Such a
  step also runs longer on the device, by a near-constant time whatever its size (0.6-1.2 ms
  on the H200 for 126- to 2,889-token prompts: the GPU and its launch queue waking, not more
  work): the median of its measured device time less the device model's, over the woken
  steps of one fresh prompt (their batch is known exactly from the step's row), is the
  profile's wake ``device_s`` (``fit_device_wake``). A decode step's ``host_s`` holds the policy's own
  scheduling and each policy's workload has hundreds of them, so it is fitted per policy;
  the prefill steps (a few dozen per policy outside ``chunked``), launching and completing
  are fitted over all policies.

Why fits and a curve rather than a table: the host costs are linear in the per-request
Python work and noisy step to step, so a fit over thousands of steps is steadier than any
cell of a table; the decode graphs are a table already (one line per size); only the
eager device time bends, and there a curve in tokens carries the bend.
"""
from __future__ import annotations

import bisect
import dataclasses
import datetime as _dt
import math
from dataclasses import dataclass

import numpy as np

from testbed.sim.costmodel.decode_plan import DecodePlan
from testbed.sim.costmodel.eager_batch import FA2_TILES, EagerBatch, Fa2Shape, fa2_query_tile  # noqa: F401 (re-exported)

PROFILE_FORMAT = 2
#: the local correction of mixed steps (LocalCorrection): the residuals of the k measured mixed
#: shapes nearest a step, weighted 1 / (distance + soften) (soften: a shape measured exactly
#: does not outweigh its neighbours, another start's measurement of it among them), when the
#: nearest lies within the radius of it (local_features' units: a factor 2**0.4 = 1.3 in one
#: of the sizes); k, radius and soften were chosen on the served steps' error by bin
#: (benchmarks/results/fidelity/experiments/README.md), not per cell
LOCAL = {"k": 3, "radius": 0.4, "soften": 0.3}
#: a step scheduled after the host sat idle this long counts as woken (fit_wake); the
#: engine's loop sleeps only when nothing is in flight and the next arrival is ahead
WAKE_GAP_S = 1e-3
WAKE_MIN_STEPS = 10


def woken(row: dict) -> bool:
    """A host-workload step scheduled after the host sat idle (rows of profiles measured before
    idle gaps were recorded have no idle_s: never woken)."""
    return (row.get("idle_s") or 0.0) > WAKE_GAP_S
HOST_FEATURES = {"decode": ("const", "reqs", "kv_tokens"), "prefill": ("const", "reqs", "tokens", "kv_tokens")}
LAUNCH_FEATURES = {"graph": ("const", "reqs"), "whole": ("const", "reqs"), "eager": ("const", "reqs", "tokens")}
COMPLETE_FEATURES = ("const", "reqs")
FA2_FEATURES = tuple(f"fa2_tile{t}" for t in FA2_TILES)
EAGER_EXTRA = ("attn_extra", "kv_extra", "reqs_extra", "imbalance") + FA2_FEATURES
MODEL_FIELDS = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_q_heads",
                "num_kv_heads", "head_dim", "vocab_size", "dtype_bytes")


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0: scipy's when installed, else ``nnls_numpy``."""
    try:
        from scipy.optimize import nnls as _sp
    except ImportError:
        return nnls_numpy(a, b)
    return _sp(a, b)[0]


def nnls_numpy(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Lawson-Hanson active-set NNLS in numpy (a few columns; the light install has no scipy)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ b
    tol = 10 * np.finfo(float).eps * np.abs(a).sum(axis=0).max(initial=0.0) * max(m, n)
    for _ in range(max_iter or 3 * n):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            neg = passive & (z <= tol)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
        w = a.T @ (b - a @ x)
    return x


def scaled_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS with columns scaled to [-1, 1] (features span 1 .. 1e6)."""
    scale = np.abs(x).max(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return nnls(x / scale, y) / scale


def median_nnls(x: np.ndarray, y: np.ndarray, iters: int = 50) -> np.ndarray:
    """Non-negative least absolute deviations (iteratively reweighted NNLS): the typical step.

    The GPU machine's host runs in regimes: on the H200 machines measured here every host
    part of a step took up to 2x as long for stretches of seconds, within one machine start
    and between starts, and a GC pause or a page fault now and then takes far longer. A mean
    follows the outliers, the fastest regime (this module's fit until 2026-12) lay under
    the engine's serving runs by a median 1.35x (the fidelity report's host-speed column);
    the median step is what a serving run mostly sees."""
    c = scaled_nnls(x, y)
    floor = 1e-3 * max(float(np.median(np.abs(y))), 1e-12)
    for _ in range(iters):
        w = np.sqrt(1.0 / np.maximum(np.abs(y - x @ c), floor))
        nxt = scaled_nnls(x * w[:, None], y * w)
        if np.allclose(nxt, c, rtol=1e-7, atol=0):
            return nxt
        c = nxt
    return c


@dataclass(frozen=True)
class WholeStepRule:
    """Which eager steps the engine replays as one whole-step CUDA graph
    (``engine.whole_step_graphs``, testbed/engine/whole_graphs.py says why this rule): a step of
    at most the largest of `sizes` tokens (padded to the smallest size that holds it) and fewer
    requests than the most `slots` (in the smallest slot count above its requests), where the
    graph's attention plan, whose query tile comes from the most rows one request could hold
    (size - slots + 1), picks the tile the eager plan would (from the batch's mean rows).
    group: query heads per KV head (a query row packs that many rows)."""
    sizes: tuple[int, ...]
    slots: tuple[int, ...]
    group: int

    def graph(self, tokens: int, reqs: int) -> tuple[int, int] | None:
        """(padded tokens, request slots) of the graph that runs a step that is not decode-only, or None."""
        if not 0 < tokens <= self.sizes[-1] or not 0 < reqs < self.slots[-1]:
            return None
        s, k = self.sizes[bisect.bisect_left(self.sizes, tokens)], self.slots[bisect.bisect_right(self.slots, reqs)]
        return (s, k) if fa2_query_tile(tokens * self.group // reqs) == fa2_query_tile((s - k + 1) * self.group) else None

    def taken(self, tokens, reqs) -> np.ndarray:
        """graph() is not None, for arrays of steps that are not decode-only."""
        t, b = np.asarray(tokens, np.int64), np.asarray(reqs, np.int64)
        sizes, slots = np.asarray(self.sizes, np.int64), np.asarray(self.slots, np.int64)
        ok = (t > 0) & (t <= sizes[-1]) & (b > 0) & (b < slots[-1])
        s = sizes[np.minimum(np.searchsorted(sizes, t), len(sizes) - 1)]
        k = slots[np.minimum(np.searchsorted(slots, b, side="right"), len(slots) - 1)]
        same = fa2_query_tile(t * self.group // np.maximum(b, 1)) == fa2_query_tile((s - k + 1) * self.group)
        return ok & same


def whole_step_rule(engine: dict, piece_sizes, group: int) -> WholeStepRule | None:
    """The WholeStepRule of a profile's engine record, or None where it ran without the graphs."""
    w = engine.get("whole_step_graphs")
    if not w:
        return None
    if not isinstance(w, dict) or not {"max_tokens", "slots"} <= set(w):
        raise ValueError(f"profile: engine.whole_step_graphs={w!r} is invalid; allowed: "
                         f"{{'max_tokens': N, 'slots': [...]}} (re-measure with `python -m testbed.profile`)")
    sizes = tuple(int(s) for s in piece_sizes if s <= w["max_tokens"])
    return WholeStepRule(sizes, tuple(int(k) for k in w["slots"]), int(group)) if sizes else None


def fa2_plan(extend, cached, fa: Fa2Shape) -> tuple[int, int, int]:
    """(query tile, KV chunk in tokens, work items) of flashinfer's fa2 batch-prefill plan for
    a batch (EagerBatch.fa2_plan says how)."""
    return EagerBatch(extend, cached).fa2_plan(fa)


def fa2_load(extend, cached, fa: Fa2Shape, plan: tuple[int, int, int] | None = None) -> np.ndarray:
    """The KV tokens the busiest SM works through under the plan (EagerBatch.fa2_load), in the
    column of the plan's query tile (FA2_FEATURES). A KV token costs more the larger the tile
    (64 query rows compute 4x 16)."""
    b = EagerBatch(extend, cached)
    plan = plan or b.fa2_plan(fa)
    load = b.fa2_load(fa, plan)
    return np.array([load if t == plan[0] else 0.0 for t in FA2_TILES], float)


def eager_extras(extend, cached, fa: Fa2Shape | None, base: int | None = None) -> np.ndarray:
    """What a batch has beyond the base curve's fresh prompt of ``base`` tokens (EAGER_EXTRA;
    EagerBatch.extras)."""
    return EagerBatch(extend, cached).extras(fa, base=base)


def local_features(extend, cached, fa: Fa2Shape) -> tuple[tuple[int, bool], np.ndarray]:
    """Where a mixed batch lies for the local correction: its group, the fa2 plan's query tile
    and whether every block is resident at once (shapes of another group are never near), and
    its place in it, log2 of its new tokens, decode rows (+1), cached tokens (+1) and the
    prefill kernel's busiest-SM load (+1, fa2_load) (EagerBatch.local_place)."""
    b = EagerBatch(extend, cached)
    plan = b.fa2_plan(fa)
    g, x = b.local_place(fa, plan, b.fa2_load(fa, plan))
    return g, np.array(x)


class LocalCorrection:
    """The eager fit's residual among measured mixed shapes, applied near them.

    One linear fit over every mixed shape leaves residuals of +-5-15% that follow the shape
    (the 64-row query tile's steps whose busiest SM carries most of the price: -10%), and the
    fits that moved them moved others the other way (benchmarks/results/fidelity/experiments/).
    A served batch replayed alone runs as long as it did served (to a median 0.4%, ibid.): the
    batch sets its time, so a measured shape near a step tells its error. The factor is
    exp(weighted mean of log(measured / fitted)) over the k nearest measured mixed shapes of the
    step's group (local_features), when the nearest is within the radius; 1 elsewhere."""

    def __init__(self, groups: dict[tuple, tuple[np.ndarray, np.ndarray]], fa: Fa2Shape, k: int, radius: float,
                 soften: float):
        self.groups, self.fa = groups, fa  # group -> (places, log residuals)
        self.k, self.radius, self.soften = k, radius, soften

    @classmethod
    def fit(cls, samples: list[dict], price, fa: Fa2Shape, k: int, radius: float, soften: float):
        """From the mixed device samples and the fitted price (extend, cached) -> seconds; None
        without any."""
        by: dict[tuple, list] = {}
        for d in samples:
            if d["kind"] == "mixed":
                e, c = sample_batch(d)
                g, x = local_features(e, c, fa)
                by.setdefault(g, []).append((x, math.log(d["device_s"] / price(e, c))))
        if not by:
            return None
        return cls({g: (np.array([x for x, _ in v]), np.array([r for _, r in v])) for g, v in by.items()},
                   fa, k, radius, soften)

    @property
    def residuals(self) -> np.ndarray:
        return np.concatenate([r for _, r in self.groups.values()])

    def factor(self, extend, cached) -> float:
        """The correction of a batch (local_features)."""
        return self.factor_at(*local_features(extend, cached, self.fa))

    def factor_at(self, group: tuple[int, bool], place) -> float:
        """The correction at a place of a group (local_features')."""
        if group not in self.groups:
            return 1.0
        places, res = self.groups[group]
        d2 = ((places - np.asarray(place)) ** 2).sum(axis=1)
        if math.sqrt(d2.min()) > self.radius:  # the nearest too far (most steps): the same test, no sort
            return 1.0
        d = np.sqrt(d2)
        near = np.argpartition(d, self.k)[: self.k] if len(d) > self.k else np.arange(len(d))
        w = 1.0 / (d[near] + self.soften)
        return math.exp(float((w * res[near]).sum() / w.sum()))


def spread_lengths(length: int, n: int) -> np.ndarray:
    """n context lengths spread evenly from 0.1x to 1.9x `length` (mean about `length`): a
    batch whose requests are at different points of their outputs, as a serving batch is."""
    if n == 1:
        return np.array([length])
    return np.maximum(1, np.round(length * np.linspace(0.1, 1.9, n))).astype(np.int64)


def skewed_lengths(length: int, n: int) -> np.ndarray:
    """n context lengths of a log-normal spread (sigma 0.6, mean about `length`): most rows
    short, a few several times the mean, as in a serving batch of conversations."""
    if n == 1:
        return np.array([length])
    from statistics import NormalDist
    z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    return np.maximum(1, np.round(length * np.exp(0.6 * z - 0.18))).astype(np.int64)


def near_lengths(length: int, n: int) -> np.ndarray:
    """n context lengths from 0.8x to 1.2x `length`, in a fixed shuffled order: a serving batch
    of similar requests (the profiler's other patterns put the longest row last)."""
    if n == 1:
        return np.array([length])
    return _shuffled(np.round(length * np.linspace(0.8, 1.2, n)).astype(np.int64), length)


def served_lengths(length: int, n: int) -> np.ndarray:
    """n context lengths of a log-normal spread (sigma 0.35, mean about `length`), in a fixed
    shuffled order: the decode batches of the fidelity runs' conversation traces (their
    contexts' coefficient of variation is mostly 0.3-0.6)."""
    if n == 1:
        return np.array([length])
    from statistics import NormalDist
    z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    return _shuffled(np.maximum(1, np.round(length * np.exp(0.35 * z - 0.06))).astype(np.int64), length)


def tailed_lengths(length: int, n: int) -> np.ndarray:
    """n - 1 context lengths from 0.8x to 1.2x `length` and one of 4x, in a fixed shuffled order:
    the large decode batches of the fidelity runs' Azure conversations (145-176 rows around
    1,100 tokens, the longest 3.4-3.9x the mean), where one row outlasts every other block."""
    if n == 1:
        return np.array([length])
    rows = np.append(np.round(length * np.linspace(0.8, 1.2, n - 1)), 4 * length).astype(np.int64)
    return _shuffled(rows, length + 1)


def _shuffled(lengths: np.ndarray, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + len(lengths)).permutation(lengths)


#: a decode sample's context pattern -> its lengths around the base context (sample_batch)
PATTERNS = {"spread": spread_lengths, "skewed": skewed_lengths, "near": near_lengths, "served": served_lengths,
            "tailed": tailed_lengths}


def _features(rows: dict[str, np.ndarray], names) -> np.ndarray:
    return np.column_stack([np.ones(len(rows["reqs"])) if f == "const" else rows[f] for f in names])


def error_stats(pred, meas) -> dict:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    if not len(meas):
        return {"n": 0}
    rel = (pred - meas) / np.where(meas > 0, meas, np.nan)
    return {"n": int(len(meas)), "measured_mean_ms": float(meas.mean() * 1e3),
            "predicted_mean_ms": float(pred.mean() * 1e3),
            "median_abs_rel_err": float(np.nanmedian(np.abs(rel))),
            "p90_abs_rel_err": float(np.nanpercentile(np.abs(rel), 90)),
            "total_rel_err": float(pred.sum() / meas.sum() - 1.0) if meas.sum() > 0 else None}


# ---------------------------------------------------------------------- device
def graph_imbalance(extend, cached, size: int) -> float:
    """imbalance() of a batch run in a CUDA graph of `size` rows: the padding rows count as rows
    (they hold thread blocks of the captured kernels like any other)."""
    ctx = np.asarray(extend) + np.asarray(cached)
    return float(size * ctx.max() - ctx.sum())


def graph_lengths(extend, cached, size: int) -> np.ndarray:
    """Every row's context as a CUDA graph of `size` rows runs the batch: its padding rows hold
    one token each."""
    ctx = np.asarray(extend, np.int64) + np.asarray(cached, np.int64)
    return np.concatenate([ctx, np.ones(size - len(ctx), np.int64)])


def fit_graph(samples: list[dict], sizes: list[int], plan: dict | None = None) -> dict:
    """Per graph size: seconds fixed, per KV token and per unit of the third feature (NNLS; the
    third column only where the size has samples to tell it apart): with `plan` (flashinfer's
    split-KV decode plan, see decode_plan.py) the busiest SM's KV tokens and a fourth, the plan's
    longest block's tail (DecodePlan.tail), otherwise graph_imbalance. A sample belongs to the
    smallest size that holds it, as the engine runs it."""
    dp = DecodePlan(**plan) if plan else None
    const, slope, third, fourth = [], [], [], []
    for s in sizes:
        ds = [d for d in samples if d["kind"] == "decode" and d["reqs"] <= s
              and sizes[int(np.searchsorted(sizes, d["reqs"]))] == s]
        if not ds:
            raise ValueError(f"profile: no decode sample at CUDA-graph size {s}")
        y = np.array([d["device_s"] for d in ds])
        kv = np.array([d["kv_tokens"] for d in ds], float)
        if dp is not None:
            x3, x4 = np.array([dp.features(graph_lengths(*sample_batch(d), s)) for d in ds]).T
            cols = [(k, x) for k, x in ((3, x3), (4, x4)) if np.ptp(x / np.maximum(kv, 1)) > 0]  # not a multiple of KV
        else:
            x3 = np.array([graph_imbalance(*sample_batch(d), s) for d in ds])
            cols = [(3, x3)] if x3.max() > 0 else []
        c = scaled_nnls(np.column_stack([np.ones(len(ds)), kv] + [x for _, x in cols]), y) if len(ds) >= 2 \
            else np.array([y.mean(), 0.0])
        fitted = {k: float(v) for (k, _), v in zip(cols, c[2:])}
        const.append(float(c[0]))
        slope.append(float(c[1]))
        third.append(fitted.get(3, 0.0))
        fourth.append(fitted.get(4, 0.0))
    out = {"sizes": list(sizes), "const_s": const, "per_kv_token_s": slope}
    if dp is None:
        return out | {"per_imbalance_s": third}
    return out | {"plan": dict(plan), "per_load_token_s": third, "per_tail_token_s": fourth}


def padded_tokens(piece_sizes, tokens) -> np.ndarray:
    """The token count an eager step runs at: the smallest piecewise-graph size that holds it
    (its linear layers run the padding rows too), or its own beyond the largest (or without
    piecewise graphs)."""
    t = np.asarray(tokens, float)
    sizes = np.asarray(piece_sizes, float)
    if not len(sizes):
        return t
    i = np.searchsorted(sizes, t)
    return np.where(t <= sizes[-1], sizes[np.minimum(i, len(sizes) - 1)], t)


def fit_eager(samples: list[dict], max_graph: int, piece_sizes=(), fa: Fa2Shape | None = None) -> dict:
    eager = [d for d in samples if not (d["kind"] == "decode" and d["reqs"] <= max_graph)]
    base = sorted((float(padded_tokens(piece_sizes, d["tokens"])), d["device_s"]) for d in eager
                  if d["kind"] == "prefill" and d["reqs"] == 1 and d["kv_tokens"] == d["tokens"])
    if len(base) < 2:
        raise ValueError("profile: fewer than two single fresh prompts to draw the eager base curve through")
    bt, bs = np.array(base, float).T
    # served batches (pattern "batch") price through LocalCorrection only: pooled into this one
    # linear fit, served-like shapes moved its other shapes' prices the wrong way (experiments/)
    rest = [d for d in eager if not (d["kind"] == "prefill" and d["reqs"] == 1 and d["kv_tokens"] == d["tokens"])
            and d.get("pattern") != "batch"]
    coef = np.zeros(len(EAGER_EXTRA))
    if rest:
        r = {k: np.array([d[k] for d in rest], float) for k in ("tokens", "device_s")}
        pad = padded_tokens(piece_sizes, r["tokens"])
        x = np.array([eager_extras(*sample_batch(d), fa, base=int(p)) for d, p in zip(rest, pad)])
        y = r["device_s"]
        w = 1.0 / y[:, None]  # relative error: a 10 ms mixed step counts as much as a 100 ms prefill
        coef = scaled_nnls(x * w, (y - base_curve(bt, bs, pad)) * w[:, 0])
    return {"base_tokens": bt.tolist(), "base_s": bs.tolist(), "coef_s": dict(zip(EAGER_EXTRA, map(float, coef))),
            "piece_sizes": [int(x) for x in piece_sizes], "fa2": dataclasses.asdict(fa) if fa else None}


def sample_batch(d: dict) -> tuple[list[int], list[int]]:
    """(extend_lens, cached_lens) of a device sample (the profiler's shapes, see device_grid: a
    mixed step is one chunk, over ``chunk_cached`` tokens, and decodes; decode rows uniform, or
    of a PATTERNS pattern around the context cached + 1)."""
    pattern = d.get("pattern", "uniform")
    if pattern == "batch":  # a batch as a policy served it (served_batches.py): its rows as they were
        return list(d["extend_lens"]), list(d["cached_lens"])
    mixed = d["kind"] == "mixed"
    rows = d["reqs"] - 1 if mixed else d["reqs"]
    if pattern == "uniform":
        cac = [d["cached"]] * rows
    elif pattern in PATTERNS:
        cac = (PATTERNS[pattern](d["cached"] + 1, rows) - 1).tolist()
    else:  # a profile from another version of the profiler: its rows cannot be rebuilt
        raise ValueError(f"profile: device sample pattern {pattern!r} is not uniform or one of {sorted(PATTERNS)}")
    if mixed:
        return [d["extend"]] + [1] * rows, [d.get("chunk_cached", 0)] + cac
    return [d["extend"]] * rows, cac


def base_curve(bt: np.ndarray, bs: np.ndarray, tokens) -> np.ndarray:
    """Piecewise linear through (bt, bs); flat below the first point, the last segment's slope beyond."""
    t = np.asarray(tokens, float)
    y = np.interp(t, bt, bs)
    slope = (bs[-1] - bs[-2]) / (bt[-1] - bt[-2])
    return np.where(t > bt[-1], bs[-1] + max(slope, 0.0) * (t - bt[-1]), y)


# ---------------------------------------------------------------------- host
def host_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    cols = {k: np.array([r[k] for r in rows], float) for k in
            ("batch_reqs", "prefill_tokens", "decode_tokens", "context_tokens", "prefill_reqs", "host_s",
             "launch_s", "complete_s", "duration_s")}
    return {"reqs": cols["batch_reqs"], "tokens": cols["prefill_tokens"] + cols["decode_tokens"],
            "kv_tokens": cols["context_tokens"], "decode": cols["prefill_reqs"] == 0, **cols}


def launch_kinds(c: dict, max_graph: int, whole: WholeStepRule | None) -> dict[str, np.ndarray]:
    """Which steps of host columns launch a decode graph, a whole-step graph or eagerly."""
    graph = c["decode"] & (c["reqs"] <= max_graph)
    taken = ~c["decode"] & whole.taken(c["tokens"], c["reqs"]) if whole else np.zeros_like(graph)
    return {"graph": graph, "whole": taken, "eager": ~graph & ~taken}


def fit_host(rows: list[dict], max_graph: int, whole: WholeStepRule | None = None) -> dict:
    """The host fits of the steps that followed no idle gap, and the wake factors of those
    that did (absent when the workloads have fewer than WAKE_MIN_STEPS of them); whole: the
    engine's whole-step graphs (their launch fitted apart), or None."""
    c = host_columns([r for r in rows if not woken(r)])
    out = {}
    for kind, on in (("decode", c["decode"]), ("prefill", ~c["decode"])):
        if on.sum() < len(HOST_FEATURES[kind]) + 1:
            raise ValueError(f"profile: {int(on.sum())} {kind} steps in the host workloads; too few to fit")
        sub = {k: v[on] for k, v in c.items()}
        out[f"host_{kind}"] = dict(zip(HOST_FEATURES[kind], map(float, median_nnls(
            _features(sub, HOST_FEATURES[kind]), sub["host_s"]))))
        out[f"complete_{kind}"] = dict(zip(COMPLETE_FEATURES, map(float, median_nnls(
            _features(sub, COMPLETE_FEATURES), sub["complete_s"]))))
    for kind, on in launch_kinds(c, max_graph, whole).items():
        if on.sum() < len(LAUNCH_FEATURES[kind]) + 1:
            if (kind == "graph" and max_graph == 0) or (kind == "whole" and whole is None):
                continue
            raise ValueError(f"profile: {int(on.sum())} {kind} steps in the host workloads; too few to fit")
        sub = {k: v[on] for k, v in c.items()}
        out[f"launch_{kind}"] = dict(zip(LAUNCH_FEATURES[kind], map(float, median_nnls(
            _features(sub, LAUNCH_FEATURES[kind]), sub["launch_s"]))))
    if "launch_graph" not in out:
        out["launch_graph"] = dict(out["launch_eager"])
    after_idle = [r for r in rows if woken(r)]
    if len(after_idle) >= WAKE_MIN_STEPS:
        out["wake"] = fit_wake(after_idle, out, max_graph, whole)
    return out


def predict_host_parts(fits: dict, reqs, tokens, kv_tokens, max_graph: int,
                       whole: WholeStepRule | None = None) -> dict[str, np.ndarray]:
    """host_s, launch_s, complete_s of the host fits for arrays of step features (a row per step)."""
    b, t, kv = (np.asarray(a, float) for a in (reqs, tokens, kv_tokens))
    decode = t == b
    on = launch_kinds({"decode": decode, "reqs": b, "tokens": t}, max_graph, whole)
    f = {"reqs": b, "tokens": t, "kv_tokens": kv}

    def lin(part, names):
        return sum(fits[part].get(k, 0.0) * (1.0 if k == "const" else f[k]) for k in names)
    return {"host_s": np.where(decode, lin("host_decode", HOST_FEATURES["decode"]),
                               lin("host_prefill", HOST_FEATURES["prefill"])),
            "launch_s": np.select([on["graph"], on["whole"]], [lin("launch_graph", LAUNCH_FEATURES["graph"]),
                                  lin("launch_whole", LAUNCH_FEATURES["whole"]) if whole else 0.0],
                                  lin("launch_eager", LAUNCH_FEATURES["eager"])),
            "complete_s": np.where(decode, lin("complete_decode", COMPLETE_FEATURES),
                                   lin("complete_prefill", COMPLETE_FEATURES))}


def fit_device_wake(rows: list[dict], model) -> tuple[float, int] | None:
    """(seconds a woken step's device time exceeds the device model's, steps it is the median
    of) over the woken host-workload steps of one prompt and no decodes, whose batch the row
    gives exactly; None when there are fewer than WAKE_MIN_STEPS of them."""
    extra = [r["duration_s"] - model.device_time([r["prefill_tokens"]], [r["context_tokens"] - r["prefill_tokens"]])
             for r in rows if woken(r) and r["batch_reqs"] == 1 and r["prefill_reqs"] == 1 and not r["decode_reqs"]]
    return (float(np.median(extra)), len(extra)) if len(extra) >= WAKE_MIN_STEPS else None


def fit_wake(rows: list[dict], fits: dict, max_graph: int, whole: WholeStepRule | None = None) -> dict:
    """The median over steps launched after an idle gap of host_s and launch_s over what the
    fits predict for them; gap_s: the idle time from which a step counts as woken."""
    c = host_columns(rows)
    p = predict_host_parts(fits, c["reqs"], c["tokens"], c["kv_tokens"], max_graph, whole)
    return {"gap_s": WAKE_GAP_S, "host": float(np.median(c["host_s"] / p["host_s"])),
            "launch": float(np.median(c["launch_s"] / p["launch_s"]))}


# ---------------------------------------------------------------------- the profile
def fa2_shape(spec, engine, num_sms: int) -> Fa2Shape | None:
    """The fa2 plan's inputs for a deployment, or None where its prefill steps run another
    kernel (engine.attention other than flashinfer, or the fa3 template) or the SMs are unknown.
    engine.attention's null is flashinfer on CUDA: read resolved, as the engine does."""
    if engine.resolved_attention() != "flashinfer" or engine.prefill_backend != "fa2" or not num_sms:
        return None
    return Fa2Shape(spec.num_q_heads // spec.num_kv_heads, spec.kv_heads_per_rank(engine.tp), int(num_sms),
                    engine.page_size)


def fit_profile(raw: dict, deployment: dict, spec, fa: Fa2Shape | None, name: str | None = None) -> dict:
    """The profile dict (calibrated.load_profile reads it back) from run_profile's output and the
    deployment it measured (testbed.profile.deployment: model, hardware, engine, policy records);
    fa: the fa2 plan's inputs of its prefill kernel (fa2_shape), or None."""
    from testbed.sim.costmodel.calibrated import CalibratedCostModel
    from testbed.sim.costmodel.hardware import load_hardware

    raw = round_samples(raw)
    sizes = list(raw["graph_sizes"])
    max_graph = sizes[-1] if sizes else 0
    dev = raw["device_samples"]
    pieces = list(raw.get("piece_sizes", []))
    eager = fit_eager(dev, max_graph, pieces, fa)
    if fa is not None:  # LocalCorrection over the grid's mixed shapes and samples["local"]
        eager["local"] = dict(LOCAL)
    device = {"graph": fit_graph(dev, sizes, raw.get("decode_plan")) if sizes else None,
              "eager": eager,
              "range": {k: int(max(d[k] for d in dev)) for k in ("reqs", "tokens", "kv_tokens")}}
    hrows = raw["host_samples"]
    by_policy = sorted({r["policy"] for r in hrows})
    whole = whole_step_rule(deployment["engine"], pieces, spec.num_q_heads // spec.num_kv_heads)
    host = {"all": fit_host(hrows, max_graph, whole)}
    for pol in by_policy:  # a decode step's scheduling cost per policy (hundreds of steps each); the rest pooled
        own = fit_host([r for r in hrows if r["policy"] == pol], max_graph)  # only its host_decode is kept
        host[pol] = {k: (own[k] if k == "host_decode" else host["all"][k]) for k in host["all"]}  # wake: pooled
    prof = {
        "format": PROFILE_FORMAT,
        "name": name,
        "fitted_on": _dt.date.today().isoformat(),
        "model": deployment["model"],
        "hardware": deployment["hardware"],
        "engine": deployment["engine"] | {"graph_sizes": sizes, "num_pages": raw["num_pages"],
                                          "piecewise_graphs": bool(pieces)},
        # the run's policy; the host workloads of the others ran at their defaults (assemble.scheduler_per_policy)
        "policy": deployment["policy"],
        "machine": raw["machine"],
        "timing": raw["timing"],
        "device": device,
        "host": host,
        # local: mixed shapes other machine starts measured, for LocalCorrection only (refit local_from=)
        "samples": {"device": dev, **({"local": raw["local_samples"]} if raw.get("local_samples") else {}),
                    "host": {k: [r.get(k) for r in hrows] for k in dict.fromkeys(
            k for r in hrows for k in r)}},
    }
    model = CalibratedCostModel(spec, load_hardware(deployment["hardware"]), profile=prof, policy="all")
    dw = fit_device_wake(hrows, model) if "wake" in host["all"] else None
    if dw is not None:  # every policy's fits share the pooled wake dict
        host["all"]["wake"] |= {"device_s": max(dw[0], 0.0), "device_n": dw[1]}
    prof["fit_error"] = fit_errors(model, prof)
    return prof


SHAPE_KEYS = ("kind", "pattern", "reqs", "tokens", "kv_tokens", "extend", "cached", "chunk_cached")
TIMING_KEYS = ("prep_s", "launch_s", "free_s", "device_s")


def pool_device_samples(grids: list[list[dict]]) -> list[dict]:
    """One device grid from the grids of several machine starts: per shape (shape_record's
    fields), the median of each timing over the starts that measured it; shapes in the order
    first seen. Two starts of one H200 machine kind measured the same shapes 1-3% apart."""
    pooled: dict[tuple, list[dict]] = {}
    for grid in grids:
        for d in grid:
            rows = (tuple(d.get("extend_lens", ())), tuple(d.get("cached_lens", ())))  # a served batch's own
            pooled.setdefault(tuple(d.get(k) for k in SHAPE_KEYS) + rows, []).append(d)
    out = []
    for ds in pooled.values():
        row = {k: v for k, v in ds[0].items() if k not in TIMING_KEYS}
        row |= {k: float(np.median([d[k] for d in ds])) for k in TIMING_KEYS if all(k in d for d in ds)}
        row["device_s_by_start"] = [d["device_s"] for d in ds]  # how far the starts lie apart
        out.append(row)
    return out


def round_samples(raw: dict) -> dict:
    """Times to 0.1 us (a host clock's resolution is ~1 us): the profile stores, and is fitted
    on, exactly these."""
    def r(row):
        return {k: (round(v, 7) if isinstance(v, float) else v) for k, v in row.items()}
    return raw | {"device_samples": [r(d) for d in raw["device_samples"]],
                  "host_samples": [r(h) for h in raw["host_samples"]]}


def fit_errors(model, prof: dict) -> dict:
    """How well the fitted model reproduces its own samples."""
    dev = prof["samples"]["device"]
    out = {}
    for kind in ("decode", "prefill", "mixed"):
        ds = [d for d in dev if d["kind"] == kind]
        if ds:
            pred = [model.device_time(*sample_batch(d)) for d in ds]
            out[f"device_{kind}"] = error_stats(pred, [d["device_s"] for d in ds])
    h = prof["samples"]["host"]
    if h:
        rows = [dict(zip(h, vals)) for vals in zip(*h.values())]
        n_woken = sum(map(woken, rows))
        rows = [r for r in rows if not woken(r)]  # woken steps: the wake factors
        w = prof["host"]["all"].get("wake")
        out["wake"] = {"n": n_woken, **({"host_factor": w["host"], "launch_factor": w["launch"],
                                         "device_s": w.get("device_s", 0.0)} if w else {})}
        for pol in sorted(set(h["policy"])):
            sub = [r for r in rows if r["policy"] == pol]
            c = host_columns(sub)
            pm = type(model)(model.spec, model.hardware, profile=prof, policy=pol)
            for col in ("host_s", "launch_s", "complete_s"):
                pred = pm.host_parts_arrays(c["reqs"], c["tokens"], c["kv_tokens"])[col]
                out[f"{pol}_{col}"] = error_stats(pred, c[col])
    return out


def report(prof: dict) -> str:
    m, mach = prof["model"], prof["machine"]
    lines = [f"profile {prof['name']}: {m['name']} on {mach.get('gpu') or mach.get('cpu')} "
             f"(driver {mach.get('driver')}, torch {mach.get('torch')}, flashinfer {mach.get('flashinfer')}), "
             f"{prof['timing']['shapes']} shapes x {prof['timing']['repeats']} in {prof['timing']['device_grid_s']:.0f} s, "
             f"host workloads {prof['timing']['host_workloads_s']:.0f} s",
             f"  {'fit of':<28} {'n':>5} {'meas mean ms':>12} {'pred mean ms':>12} {'p50 |rel|':>9} {'p90 |rel|':>9} {'total':>7}"]
    for k, e in prof["fit_error"].items():
        if k != "wake" and e.get("n"):
            lines.append(f"  {k:<28} {e['n']:>5} {e['measured_mean_ms']:>12.3f} {e['predicted_mean_ms']:>12.3f} "
                         f"{e['median_abs_rel_err']:>9.1%} {e['p90_abs_rel_err']:>9.1%} {e['total_rel_err']:>+7.1%}")
    w = prof["fit_error"].get("wake", {})
    lines.append(f"  steps after an idle gap: {w.get('n', 0)}" + (
        f"; wake factors host x{w['host_factor']:.2f}, launch x{w['launch_factor']:.2f}, device "
        f"+{w.get('device_s', 0.0) * 1e3:.2f} ms" if "host_factor" in w
        else " (too few for wake factors)"))
    return "\n".join(lines)
