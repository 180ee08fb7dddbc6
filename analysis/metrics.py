"""Metrics over loaded runs.

Aggregates come from the one implementation the runs themselves use
(`testbed.timeline.metrics.summarize`), so a number here equals the one in summary.json;
this module adds grouping, SLOs chosen after the fact, latency distributions and the
time series of steps.parquet.

Per-request latency columns, in ms: ttft, tpot, itl (one value per gap between tokens),
e2e, queue (arrival -> first scheduled).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from testbed.timeline.metrics import latency_samples, offered_rate, summarize

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
UNITS = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)", "itl": "inter-token latency (ms)",
         "e2e": "end-to-end latency (ms)", "queue": "queueing delay (ms)"}


def require_columns(df: pd.DataFrame, what: str, keys) -> None:
    """A one-line ValueError naming the keys (None: not asked for) that are not columns of df."""
    missing = [k for k in keys if k is not None and k not in df.columns]
    if missing:
        raise ValueError(f"{what}: no column {', '.join(map(repr, missing))}; the columns: "
                         f"{', '.join(map(str, df.columns))}")


def _by(df: pd.DataFrame, by) -> list[str]:
    if by is None:
        return ["job"] if "job" in df else []
    keys = [by] if isinstance(by, str) else list(by)
    require_columns(df, f"by={by!r}", keys)
    return keys


def _bin(bin_s: float | None, may_be_none: bool) -> None:
    if (bin_s is None and not may_be_none) or (bin_s is not None and not bin_s > 0):
        raise ValueError(f"bin_s={bin_s!r} is invalid; allowed: a number of seconds > 0"
                         + (" or None (no binning)" if may_be_none else ""))


def _groups(df: pd.DataFrame, by):
    keys = _by(df, by)
    if not keys:
        yield (), df
        return
    for k, g in df.groupby(keys, sort=False, dropna=False):
        yield (k if isinstance(k, tuple) else (k,)), g


def finished(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["state"] == "FINISHED"]


def latency_values(requests: pd.DataFrame, metric: str) -> np.ndarray:
    """One latency in ms per finished request (per token gap for itl), NaNs dropped."""
    if metric not in LATENCIES:
        raise ValueError(f"unknown latency {metric!r}; known: {', '.join(LATENCIES)}")
    return latency_samples(finished(requests))["e2el" if metric == "e2e" else metric]


def percentiles(requests: pd.DataFrame, by=None, metrics=("ttft", "tpot", "itl", "e2e", "queue"),
                pcts=(50, 90, 99)) -> pd.DataFrame:
    """A row per group (default: per job): mean and the given percentiles of each latency, ms.
    Columns are named like summary.json (`p99_ttft_ms`; p50 is `median_..._ms`)."""
    rows = []
    for key, g in _groups(requests, by):
        row = dict(zip(_by(requests, by), key))
        for m in metrics:
            v = latency_values(g, m)
            row[f"mean_{m}_ms"] = float(v.mean()) if len(v) else np.nan
            for p in pcts:
                name = "median" if p == 50 else f"p{p:g}"
                row[f"{name}_{m}_ms"] = float(np.percentile(v, p)) if len(v) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_groups(requests: pd.DataFrame, steps: pd.DataFrame | None = None, by=None,
                     slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                     slo_e2e_ms: float | None = None) -> pd.DataFrame:
    """summary.json's metrics recomputed per group (default: per job), for SLOs chosen now:
    throughput, goodput, slo_attainment, latency percentiles, queueing delay, prefix-cache hit
    rate, preemptions, KV utilisation. Group by job (not by policy) when jobs differ in more
    than one key, or requests of different runs share a denominator."""
    keys = _by(requests, by)
    step_groups = dict(_groups(steps, keys)) if steps is not None and len(steps) else {}
    rows = []
    for key, g in _groups(requests, keys):
        rows.append({**dict(zip(keys, key)), **summarize(g, step_groups.get(key), slo_ttft_ms, slo_tpot_ms, slo_e2e_ms),
                     "offered_rate": offered_rate(g)})
    return pd.DataFrame(rows)


def slo_attainment(requests: pd.DataFrame, ttft_ms: float | None, tpot_ms: float | None, by=None,
                   e2e_ms: float | None = None) -> pd.DataFrame:
    """Per group: share of all requests that finished within every SLO given, and goodput (req/s)."""
    if ttft_ms is None and tpot_ms is None and e2e_ms is None:
        raise ValueError("no SLO to attain: give ttft_ms, tpot_ms and/or e2e_ms")
    cols = _by(requests, by) + ["completed", "request_throughput", "slo_attainment", "goodput"]
    df = summarize_groups(requests, None, by, ttft_ms, tpot_ms, e2e_ms)
    return df[cols] if len(df) else pd.DataFrame(columns=cols)


def slo_curve(requests: pd.DataFrame, ttft_ms, tpot_ms=None, by=None) -> pd.DataFrame:
    """Attainment as the TTFT SLO (a list of ms) varies, TPOT SLO fixed: long format."""
    parts = []
    for t in np.atleast_1d(ttft_ms):
        d = slo_attainment(requests, float(t), tpot_ms, by)
        d.insert(0, "slo_ttft_ms", float(t))
        parts.append(d)
    return pd.concat(parts, ignore_index=True)


def cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF in (0, 1]."""
    v = np.sort(np.asarray(values, float))
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def latency_cdf(requests: pd.DataFrame, metric: str = "ttft", by=None) -> pd.DataFrame:
    """Long format for CDF plots: group columns, value_ms, cdf."""
    parts = []
    for key, g in _groups(requests, by):
        v, c = cdf(latency_values(g, metric))
        d = pd.DataFrame({"value_ms": v, "cdf": c})
        for k, x in zip(_by(requests, by), key):
            d.insert(0, k, x)
        parts.append(d)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["value_ms", "cdf"])


# ---- steps.parquet: KV and batches over time -------------------------------------------------
def kv_timeline(steps: pd.DataFrame, bin_s: float | None = None) -> pd.DataFrame:
    """KV pool over time, per job: time_s and pages used (by requests), cached (prefix cache,
    evictable), free, and their shares of the pool (used_frac, cached_frac, free_frac).
    bin_s: average into bins of that many seconds (a 1,000-request run has ~40k steps)."""
    _bin(bin_s, may_be_none=True)
    cols = ["pages_used", "pages_cached", "pages_free", "running", "waiting", "evicted_pages", "preempted"]
    out = []
    for key, g in _groups(steps, None):
        d = pd.DataFrame({"time_s": g["end_s"].to_numpy(float), **{c: g[c].to_numpy() for c in cols}})
        if bin_s is not None:
            b = (d["time_s"] // bin_s) * bin_s
            agg = {c: "mean" for c in cols} | {"evicted_pages": "sum", "preempted": "sum"}
            d = d.drop(columns="time_s").groupby(b.rename("time_s")).agg(agg).reset_index()
        total = d["pages_used"] + d["pages_cached"] + d["pages_free"]
        for c in ("used", "cached", "free"):
            d[f"{c}_frac"] = d[f"pages_{c}"] / total
        for k, x in zip(_by(steps, None), key):
            d.insert(0, k, x)
        out.append(d)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def batch_composition(steps: pd.DataFrame, bin_s: float = 1.0) -> pd.DataFrame:
    """Per job and time bin: prefill and decode tokens per second of simulated (or wall)
    time, mean requests per step, mean step duration (ms), and steps run."""
    _bin(bin_s, may_be_none=False)
    out = []
    for key, g in _groups(steps, None):
        b = ((g["start_s"] // bin_s) * bin_s).rename("time_s")
        d = g.groupby(b).agg(prefill_tokens=("prefill_tokens", "sum"), decode_tokens=("decode_tokens", "sum"),
                             prefill_reqs=("prefill_reqs", "mean"), decode_reqs=("decode_reqs", "mean"),
                             batch_reqs=("batch_reqs", "mean"), step_ms=("duration_s", "mean"),
                             steps=("step", "count")).reset_index()
        d["prefill_tok_s"] = d["prefill_tokens"] / bin_s
        d["decode_tok_s"] = d["decode_tokens"] / bin_s
        d["step_ms"] *= 1000.0
        for k, x in zip(_by(steps, None), key):
            d.insert(0, k, x)
        out.append(d)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def prefix_hits(requests: pd.DataFrame, by=None) -> pd.DataFrame:
    """Per group: prompt tokens, tokens found in the prefix cache, hit rate, share of requests
    with any hit, recomputed tokens and preemptions."""
    rows = []
    for key, g in _groups(requests, by):
        done = finished(g)
        prompt = int(done["prompt_tokens"].sum())
        hit = int(done["prefix_cached_tokens"].sum())
        rows.append({**dict(zip(_by(requests, by), key)), "prompt_tokens": prompt, "cached_tokens": hit,
                     "hit_rate": hit / prompt if prompt else 0.0,
                     "requests_with_hit": float((done["prefix_cached_tokens"] > 0).mean()) if len(done) else 0.0,
                     "recomputed_tokens": int(g["recomputed_tokens"].sum()),
                     "preemptions": int(g["preemptions"].sum())})
    return pd.DataFrame(rows)
