"""Aggregate metrics under the names serving benchmarks use.

The names are `vllm bench serve`'s (`completed`, `failed`, `request_throughput`,
`request_goodput`, `output_throughput`, `total_token_throughput`, `mean/median/std/p99_ttft_ms`
and the same for `tpot`, `itl`, `e2el`), plus p90s, queueing delay and testbed's own counts.
`..._e2e_latency_ms` and `goodput` are the names summary.json used before it followed vLLM;
they stay beside `..._e2el_ms` and `request_goodput` (same values) for the readers of runs
written before (the committed fidelity runs among them).

summarize reads pandas DataFrames (analysis, the export) or numpy columns as pandas holds
them (the writer's: a simulator run writes its files without importing pandas)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

STATES_DONE = ("FINISHED", "REJECTED", "ABORTED", "FAILED")
PERCENTILES = (90, 99)  # besides the median
# the columns summarize reads: a writer hands it only these (not the chunk lists, nor a long
# run's 20 other step columns)
REQUEST_COLUMNS = ("state", "arrival_s", "finish_s", "prompt_tokens", "output_tokens", "prefix_cached_tokens",
                   "preemptions", "ttft_s", "tpot_s", "e2e_s", "queue_s", "token_times_s")
STEP_COLUMNS = ("pages_used", "pages_cached", "pages_free", "batch_reqs", "evicted_pages")
GAP_BLOCK = 1 << 16  # token gaps worked out at a time


def latency_samples(done: pd.DataFrame, gaps: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Finite latencies of finished requests, ms, as vLLM's benchmark collects them: ttft,
    tpot (requests with more than one output token), itl (every gap between two tokens of
    a request), e2el (arrival to last token), and queue (arrival to first scheduled).
    gaps: the itl gaps in seconds (token_gaps) when `done` has no token_times_s column; an
    array of the caller's to use up (scaled to ms in place)."""
    def ms(v, own: bool = False) -> np.ndarray:
        v = np.asarray(v, dtype=float)
        v = np.multiply(v, 1000.0, out=v) if own else v * 1000.0  # own: scaled in place (millions of gaps)
        finite = np.isfinite(v)
        return v if finite.all() else v[finite]
    if gaps is None:
        import pyarrow as pa
        gaps = token_gaps(pa.array(list(done["token_times_s"]), type=pa.list_(pa.float64())))
    return {"ttft": ms(done["ttft_s"]), "tpot": ms(done["tpot_s"]), "itl": ms(gaps, own=True),
            "e2el": ms(done["e2e_s"]), "queue": ms(done["queue_s"])}


def token_gaps(token_times) -> np.ndarray:
    """Every gap between two tokens of a request, the requests in order, from a pyarrow list
    column of their token times (nulls: none), worked on flat: a long run has millions."""
    import pyarrow.compute as pc
    lens = pc.list_value_length(token_times).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(token_times).to_numpy(zero_copy_only=False).astype(float, copy=False)
    return gaps_within(flat, lens)


def gaps_within(flat: np.ndarray, lens: np.ndarray, in_place: bool = False) -> np.ndarray:
    """token_gaps of the token times flat, lens: each request's count. in_place: flat is the
    caller's to use up (the gaps are written over its head; a run's token times are tens of MB)."""
    if len(flat) < 2:
        return np.zeros(0)
    inside = np.ones(len(flat) - 1, bool)  # gap i is flat[i + 1] - flat[i]: inside a request unless i + 1 starts one
    starts = np.cumsum(lens)[:-1]
    inside[starts[(starts > 0) & (starts < len(flat))] - 1] = False
    # block by block into the result: the gaps with the ones between requests (a run's
    # millions) are never held beside it
    k = int(np.count_nonzero(inside))
    out = flat[:k] if in_place and flat.flags.writeable and flat.dtype == np.float64 else np.empty(k)
    at = 0  # <= a: a block's gaps land before what the next block reads
    for a in range(0, len(inside), GAP_BLOCK):
        b = min(a + GAP_BLOCK, len(inside))
        d = flat[a + 1:b + 1] - flat[a:b]
        keep = inside[a:b]
        n = int(np.count_nonzero(keep))
        out[at:at + n] = d if n == b - a else d[keep]
        at += n
    return out


def _std(v: np.ndarray, block: int = 1 << 20) -> float:
    """v.std() (population), over blocks of a long array: numpy's holds v - mean beside v (a
    run's millions of token gaps); up to a block it is numpy's own."""
    if len(v) <= block:
        return float(v.std())
    mean = v.mean()
    total = 0.0
    for a in range(0, len(v), block):
        d = v[a:a + block] - mean
        total += float(np.multiply(d, d, out=d).sum())
    return math.sqrt(total / len(v))


def stat_name(stat, metric: str) -> str:
    """vLLM's key of a statistic: mean/median/std, or a percentile (99 -> p99, 99.9 -> p99.9)."""
    if not isinstance(stat, str):
        stat = f"p{int(stat)}" if float(stat).is_integer() else f"p{stat:g}"
    return f"{stat}_{metric}_ms"


def latency_stats(metric: str, v: np.ndarray, percentiles=PERCENTILES, scratch: bool = False) -> dict:
    """mean, median, std (population, as numpy's and vLLM's) and the percentiles of one latency;
    None for each when there is no value. scratch: v is the caller's to reorder (the order
    statistics partition it in place instead of copying it)."""
    stats = ("mean", "median", "std", *percentiles)
    if not len(v):
        return {stat_name(s, metric): None for s in stats}
    mean, std = float(v.mean()), _std(v)  # before any reordering: their sums run in v's order
    median = float(np.median(v, overwrite_input=scratch))
    qs = np.percentile(v, percentiles, overwrite_input=scratch)
    out = {stat_name("mean", metric): mean, stat_name("median", metric): median, stat_name("std", metric): std}
    out.update({stat_name(p, metric): float(q) for p, q in zip(percentiles, qs)})
    return out


def slo_met(done: pd.DataFrame, ttft_ms=None, tpot_ms=None, e2e_ms=None) -> np.ndarray:
    """Per finished request: whether it meets every SLO given (vLLM's goodput rule: a latency
    at most its SLO; a one-token output has no TPOT and meets any TPOT SLO)."""
    ok = np.ones(len(done["e2e_s"]), bool)  # done: a DataFrame or summarize's numpy columns
    for limit, col in ((ttft_ms, "ttft_s"), (tpot_ms, "tpot_s"), (e2e_ms, "e2e_s")):
        if limit is not None:
            ok &= ~(np.asarray(done[col], dtype=float) * 1000 > limit)  # NaN (no TPOT) compares False
    return ok


def offered_rate(requests: pd.DataFrame) -> float:
    """Arrivals per second over the arrival window: the load a run was offered (req/s)."""
    a = requests["arrival_s"].to_numpy(dtype=float)
    if len(a) < 2 or a.max() <= a.min():
        return float("inf") if len(a) else 0.0
    return (len(a) - 1) / float(a.max() - a.min())


def columns(table, names) -> dict[str, np.ndarray]:
    """The columns `names` that `table` has (a DataFrame, or a mapping of numpy columns as
    pandas holds them), as numpy arrays."""
    if isinstance(table, Mapping):
        return {n: np.asarray(table[n]) for n in names if n in table}
    return {n: table[n].to_numpy() for n in names if n in table.columns}


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | None = None, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, slo_e2e_ms: float | None = None, token_times=None,
              token_times_scratch: bool = False) -> dict:
    """Metrics over one run's requests.parquet (and steps.parquet for KV/batch figures), each a
    DataFrame or numpy columns (columns()). Throughputs are over the run's duration: first
    arrival to last finish. token_times: the requests' token times as (flat values, offsets:
    request i's are values[offsets[i]:offsets[i + 1]]) in their rows' order, when `requests`
    leaves that column out (the writer keeps a run's token times flat); token_times_scratch:
    its values are the caller's to use up. Sums, minima, maxima and means skip NaN, as pandas' do."""
    req = columns(requests, REQUEST_COLUMNS)
    state = req["state"]
    n = len(state)
    finished = state == "FINISHED"
    done = {k: v[finished] for k, v in req.items()}
    completed = int(finished.sum())
    gaps = None
    if token_times is not None:
        flat, offsets = token_times
        lens = np.diff(offsets)
        every = bool(finished.all())  # else the finished ones' times are a copy of the run's to use up
        gaps = gaps_within(flat if every else flat[np.repeat(finished, lens)], lens[finished],
                           in_place=not every or token_times_scratch)
    out = {
        "num_requests": n,
        "completed": completed,
        "failed": n - completed,  # arrived and did not finish: rejected, aborted, errors, unfinished
        "rejected": int((state == "REJECTED").sum()),
        "aborted": int((state == "ABORTED").sum()),
        "errors": int((state == "FAILED").sum()),  # backend=http: HTTP / connection errors, timeouts
        "unfinished": int((~np.isin(state, STATES_DONE)).sum()),
    }
    end = float(np.nanmax(done["finish_s"])) if completed else 0.0
    start = float(np.nanmin(req["arrival_s"])) if n else 0.0
    duration = max(end - start, 1e-12)
    prompt = int(np.nansum(done["prompt_tokens"]))
    output = int(np.nansum(done["output_tokens"]))
    out.update({
        "duration_s": end - start,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": completed / duration if completed else 0.0,
        "output_throughput": output / duration if completed else 0.0,
        "total_token_throughput": (prompt + output) / duration if completed else 0.0,
    })
    samples = latency_samples(done, gaps)
    for metric in ("ttft", "tpot", "itl", "e2el", "queue"):
        out.update(latency_stats(metric, samples[metric], scratch=True))
    out.update({k.replace("_e2el_", "_e2e_latency_"): v for k, v in out.items() if "_e2el_" in k and "std" not in k})
    if n and np.isnan(np.asarray(req["preemptions"], dtype=float)).all():  # a client's run (backend=http): not known
        out["prefix_cache_hit_rate"] = out["preemptions"] = None
    else:
        hits = int(np.nansum(done["prefix_cached_tokens"]))
        out["prefix_cache_hit_rate"] = hits / prompt if prompt else 0.0
        out["preemptions"] = int(np.nansum(req["preemptions"]))
    out["request_goodput"] = None  # vLLM writes null when no SLO is given
    if any(s is not None for s in (slo_ttft_ms, slo_tpot_ms, slo_e2e_ms)):
        good = int(slo_met(done, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms).sum())
        out["request_goodput"] = out["goodput"] = float(good / duration) if completed else 0.0
        out["slo_attainment"] = float(good / n) if n else 0.0
    st = columns(steps, STEP_COLUMNS) if steps is not None else {}
    if st and len(st["pages_used"]):
        total = st["pages_used"] + st["pages_cached"] + st["pages_free"]
        out["num_steps"] = len(st["pages_used"])
        out["mean_batch_reqs"] = float(np.nanmean(st["batch_reqs"]))
        out["mean_kv_utilization"] = float(np.nanmean(st["pages_used"] / total))
        out["evicted_pages"] = int(np.nansum(st["evicted_pages"]))
    return out
