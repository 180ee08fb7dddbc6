"""Run against run: the same trace replayed twice (two policies, two cost models, or the
simulator against the GPU engine) compared request by request.

    ref = load("outputs/engine-run").requests          # the measurement
    sim = load("outputs/sim-run").requests             # the prediction
    j = join_requests(ref, sim)                        # a row per rid: <m>_ref, <m>_cand, errors
    error_summary(j)                                   # a row per latency: bias, MAE, MAPE, p90 |rel err|
    cdf_overlay({"engine": ref, "sim": sim}, "ttft")   # long frame for an overlaid CDF plot
    step_time_error(load("outputs/engine-run").steps)  # cost model vs measured step times

Any argument that takes requests also takes a run directory path or a `Results`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.metrics import latency_cdf, percentiles, require_columns

# compared per request; *_ms columns are added from the *_s ones
COMPARED = ("ttft", "tpot", "e2e", "queue")
IDENTITY = ("prompt_tokens", "output_tokens")


def _requests(x) -> pd.DataFrame:
    from analysis.load import Results, load
    if isinstance(x, (str, Path)):
        x = load(x, steps=False, warn=False)
    if isinstance(x, Results):
        if len(x.summaries) != 1:
            raise ValueError(f"{x.root}: {len(x.summaries)} jobs; pick one with results.job(name)")
        x = x.requests
    return x


def join_requests(reference, candidate, metrics=COMPARED, finished_only: bool = True) -> pd.DataFrame:
    """A row per rid present in both runs: for each latency m, `m_ref_ms`, `m_cand_ms`,
    `m_err_ms` (cand - ref) and `m_rel_err` ((cand - ref) / ref); prompt / output tokens of
    both and `same_shape` (equal token counts: the runs replayed the same request). Requests
    that did not finish in either run are dropped when finished_only (counted in attrs)."""
    a, b = _requests(reference), _requests(candidate)
    cols = ["rid", "state", "arrival_s", *IDENTITY, "prefix_cached_tokens", "preemptions",
            *[f"{m}_s" for m in metrics]]
    for name, df in (("reference", a), ("candidate", b)):
        require_columns(df, f"{name}: not a requests.parquet table", cols)
    j = a[cols].merge(b[cols], on="rid", how="inner", suffixes=("_ref", "_cand"))
    attrs = {"only_reference": int((~a["rid"].isin(b["rid"])).sum()),
             "only_candidate": int((~b["rid"].isin(a["rid"])).sum())}
    if finished_only:
        ok = (j["state_ref"] == "FINISHED") & (j["state_cand"] == "FINISHED")
        attrs["not_finished_in_both"] = int((~ok).sum())
        j = j[ok].reset_index(drop=True)
    j["same_shape"] = np.logical_and.reduce([j[f"{c}_ref"] == j[f"{c}_cand"] for c in IDENTITY])
    for m in metrics:
        r = j.pop(f"{m}_s_ref").astype(float) * 1000.0
        c = j.pop(f"{m}_s_cand").astype(float) * 1000.0
        j[f"{m}_ref_ms"], j[f"{m}_cand_ms"] = r, c
        j[f"{m}_err_ms"] = c - r
        j[f"{m}_rel_err"] = (c - r) / r.where(r > 0)
    j.attrs.update(attrs)
    return j


def error_summary(joined: pd.DataFrame, metrics=COMPARED) -> pd.DataFrame:
    """A row per latency: n, mean of ref and cand (ms), bias (mean error, ms), MAE (ms), MAPE
    (mean |rel err|), median / p90 / p99 |rel err|, Pearson r, and the relative error of the
    run-level median and p99 (what a summary table would show)."""
    rows = []
    for m in metrics:
        r, c = joined[f"{m}_ref_ms"], joined[f"{m}_cand_ms"]
        ok = r.notna() & c.notna()
        r, c = r[ok].to_numpy(float), c[ok].to_numpy(float)
        rel = np.abs(joined.loc[ok, f"{m}_rel_err"].to_numpy(float))
        rel = rel[np.isfinite(rel)]
        if not len(r):
            rows.append({"metric": m, "n": 0})
            continue
        q = lambda v, p: float(np.percentile(v, p)) if len(v) else np.nan  # noqa: E731
        rows.append({
            "metric": m, "n": int(len(r)), "ref_mean_ms": float(r.mean()), "cand_mean_ms": float(c.mean()),
            "bias_ms": float((c - r).mean()), "mae_ms": float(np.abs(c - r).mean()),
            "mape": float(rel.mean()) if len(rel) else np.nan,
            "median_abs_rel_err": q(rel, 50), "p90_abs_rel_err": q(rel, 90), "p99_abs_rel_err": q(rel, 99),
            "pearson_r": float(np.corrcoef(r, c)[0, 1]) if len(r) > 1 and r.std() > 0 and c.std() > 0 else np.nan,
            "median_rel_err": (q(c, 50) - q(r, 50)) / q(r, 50) if q(r, 50) else np.nan,
            "p99_rel_err": (q(c, 99) - q(r, 99)) / q(r, 99) if q(r, 99) else np.nan,
        })
    return pd.DataFrame(rows)


def compare(reference, candidate, metrics=COMPARED) -> dict:
    """Everything at once: {"joined", "errors", "percentiles"} (the last: a row per run)."""
    a, b = _requests(reference), _requests(candidate)
    j = join_requests(a, b, metrics)
    pct = pd.concat([percentiles(a.assign(run="reference"), by="run"),
                     percentiles(b.assign(run="candidate"), by="run")], ignore_index=True)
    return {"joined": j, "errors": error_summary(j, metrics), "percentiles": pct}


def cdf_overlay(runs: dict, metric: str = "ttft") -> pd.DataFrame:
    """Long frame (run, value_ms, cdf) of one latency for several runs: {label: requests}."""
    parts = [latency_cdf(_requests(x).assign(run=label), metric, by="run") for label, x in runs.items()]
    return pd.concat(parts, ignore_index=True)


def step_time_error(steps: pd.DataFrame) -> pd.DataFrame:
    """Cost model against measurement on an engine run's steps (predicted_s vs duration_s):
    per job and step kind (prefill / decode / mixed): steps, measured and predicted mean ms,
    mean relative error (bias) and mean |relative error|. In a simulator run the measured column
    is the modelled device time, which is the cost model's own (predicted) time stretched where the
    host launches slower than the device runs: never below it, equal under the roofline."""
    s = steps.copy()
    s["kind"] = np.where(s["prefill_reqs"] > 0, np.where(s["decode_reqs"] > 0, "mixed", "prefill"), "decode")
    s["rel_err"] = (s["predicted_s"] - s["duration_s"]) / s["duration_s"].where(s["duration_s"] > 0)
    s["abs_rel_err"] = s["rel_err"].abs()
    keys = ["job", "kind"] if "job" in s else ["kind"]
    out = s.groupby(keys).agg(steps=("step", "count"), measured_ms=("duration_s", "mean"),
                              predicted_ms=("predicted_s", "mean"), mean_rel_err=("rel_err", "mean"),
                              mean_abs_rel_err=("abs_rel_err", "mean"))
    out[["measured_ms", "predicted_ms"]] *= 1000.0
    return out.reset_index()
