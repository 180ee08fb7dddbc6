"""Aggregate metrics under the names serving benchmarks use (vLLM/SGLang bench_serving)."""
from __future__ import annotations

import numpy as np
import pandas as pd


def _pcts(prefix: str, values_s: np.ndarray) -> dict:
    v = np.asarray(values_s, dtype=float) * 1000.0
    v = v[np.isfinite(v)]
    if not len(v):
        return {f"{k}_{prefix}_ms": None for k in ("mean", "median", "p90", "p99")}
    return {f"mean_{prefix}_ms": float(v.mean()), f"median_{prefix}_ms": float(np.median(v)),
            f"p90_{prefix}_ms": float(np.percentile(v, 90)), f"p99_{prefix}_ms": float(np.percentile(v, 99))}


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | None = None,
              slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None) -> dict:
    """Metrics over one run's requests.parquet (and steps.parquet for KV/batch figures)."""
    done = requests[requests["state"] == "FINISHED"]
    out = {
        "num_requests": int(len(requests)),
        "completed": int(len(done)),
        "rejected": int((requests["state"] == "REJECTED").sum()),
        "aborted": int((requests["state"] == "ABORTED").sum()),
        "unfinished": int((~requests["state"].isin(["FINISHED", "REJECTED", "ABORTED"])).sum()),
    }
    end = float(done["finish_s"].max()) if len(done) else 0.0
    start = float(requests["arrival_s"].min()) if len(requests) else 0.0
    duration = max(end - start, 1e-12)
    prompt = int(done["prompt_tokens"].sum())
    output = int(done["output_tokens"].sum())
    out.update({
        "duration_s": end - start,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": len(done) / duration if len(done) else 0.0,
        "output_throughput": output / duration if len(done) else 0.0,
        "total_token_throughput": (prompt + output) / duration if len(done) else 0.0,
    })
    out.update(_pcts("ttft", done["ttft_s"].to_numpy(dtype=float)))
    out.update(_pcts("tpot", done["tpot_s"].dropna().to_numpy(dtype=float)))
    itl = [np.diff(t) for t in done["token_times_s"] if t is not None and len(t) > 1]
    out.update(_pcts("itl", np.concatenate(itl) if itl else np.zeros(0)))
    out.update(_pcts("e2e_latency", done["e2e_s"].to_numpy(dtype=float)))
    out.update(_pcts("queue", done["queue_s"].to_numpy(dtype=float)))
    hits = int(done["prefix_cached_tokens"].sum())
    out["prefix_cache_hit_rate"] = hits / prompt if prompt else 0.0
    out["preemptions"] = int(requests["preemptions"].sum())
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        ok = np.ones(len(done), bool)
        if slo_ttft_ms is not None:
            ok &= done["ttft_s"].to_numpy(dtype=float) * 1000 <= slo_ttft_ms
        if slo_tpot_ms is not None:
            tpot = done["tpot_s"].to_numpy(dtype=float)
            ok &= ~(tpot * 1000 > slo_tpot_ms)  # one-token outputs (NaN TPOT) meet any TPOT SLO
        out["slo_attainment"] = float(ok.sum() / len(requests)) if len(requests) else 0.0
        out["goodput"] = float(ok.sum() / duration) if len(done) else 0.0
    if steps is not None and len(steps):
        total = steps["pages_used"] + steps["pages_cached"] + steps["pages_free"]
        out["num_steps"] = int(len(steps))
        out["mean_batch_reqs"] = float(steps["batch_reqs"].mean())
        out["mean_kv_utilization"] = float((steps["pages_used"] / total).mean())
        out["evicted_pages"] = int(steps["evicted_pages"].sum())
    return out
