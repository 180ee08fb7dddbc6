"""A run as the result JSON of `vllm bench serve --save-result` (vLLM's benchmarks/serve.py):
the same keys, units (lists in seconds, statistics in ms) and definitions (TPOT over requests
with more than one output token, ITL over every gap between two tokens, goodput over finished
requests meeting every SLO), so scripts written for vLLM's files read a testbed run.

Where testbed knows more than vLLM's client would, it says so under the `testbed` key
(backend, policy, trace, SLOs, where request_rate came from). vLLM's `generated_texts` and
`rtfx` are left out: a run has no text and no audio."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from testbed.export.rundir import RunData
from testbed.timeline.metrics import latency_samples, latency_stats, offered_rate, summarize

DEFAULT_PERCENTILES = (99,)  # vllm bench serve's --metric-percentiles default
LATENCIES = ("ttft", "tpot", "itl", "e2el")  # --percentile-metrics ttft,tpot,itl,e2el


def peak_output_rate(done: pd.DataFrame) -> float:
    """The most output tokens in one second, counting seconds from the first arrival (vLLM's
    max_output_tokens_per_s)."""
    if not len(done):
        return 0.0
    times = np.concatenate([np.asarray(t, float) for t in done["token_times_s"] if t is not None and len(t)]
                           or [np.zeros(0)])
    if not len(times):
        return 0.0
    buckets = np.floor(times - float(done["arrival_s"].min())).astype(np.int64)
    return float(np.bincount(buckets[buckets >= 0]).max())


def peak_concurrency(done: pd.DataFrame) -> int:
    """The most finished requests in flight at once, each over [arrival, finish) (vLLM's
    max_concurrent_requests)."""
    if not len(done):
        return 0
    start = done["arrival_s"].to_numpy(float)
    end = start + done["e2e_s"].to_numpy(float)
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones(len(start), np.int64), -np.ones(len(end), np.int64)])
    order = np.lexsort((steps, times))  # at one instant an end goes before a start: intervals are half-open
    return int(np.cumsum(steps[order]).max())


def synthesized(run: RunData) -> bool:
    """Whether the run drew its arrivals at trace.rate (runs written before summary.json said so: no)."""
    return (run.summary.get("trace") or {}).get("synthesized_arrivals") is True


def request_rate(run: RunData) -> tuple[object, str]:
    """(vLLM's request_rate, where it came from): trace.rate when the run drew its arrivals at
    that rate, else the rate its own arrival times offered."""
    if synthesized(run):
        rate, source = float(run.config["trace"]["rate"]), "trace.rate (arrivals drawn at that rate)"
    else:
        rate, source = offered_rate(run.requests), "measured: arrivals over the arrival window (the trace's own times)"
    return ("inf" if math.isinf(rate) else rate), source


def _seconds(v) -> float:
    return 0.0 if v is None or not math.isfinite(v) else float(v)


def per_request_lists(req: pd.DataFrame) -> dict:
    """vLLM's --save-detailed lists, one entry per request in rid order; a request that did
    not finish has vLLM's failed-request values (0 tokens out, 0.0 s, no gaps) and its error."""
    ok = (req["state"] == "FINISHED").to_numpy()
    gaps = [list(np.diff(np.asarray(t, float))) if good and t is not None and len(t) > 1 else []
            for good, t in zip(ok, req["token_times_s"])]
    errors = []
    for good, state, why, reason in zip(ok, req["state"], req["reject_reason"], req["finish_reason"]):
        errors.append("" if good else f"{state.lower()}: {why or reason or 'the run stopped before it finished'}")
    return {
        "input_lens": [int(x) for x in req["prompt_tokens"]],
        "output_lens": [int(x) if good else 0 for good, x in zip(ok, req["output_tokens"])],
        "ttfts": [_seconds(x) if good else 0.0 for good, x in zip(ok, req["ttft_s"])],
        "itls": [[float(g) for g in row] for row in gaps],
        "latencies": [_seconds(x) if good else 0.0 for good, x in zip(ok, req["e2e_s"])],
        "start_times": [float(x) for x in req["arrival_s"]],
        "errors": errors,
    }


def vllm_result(run: RunData, percentiles=DEFAULT_PERCENTILES, detailed: bool = False) -> dict:
    req = run.requests
    m = summarize(req, None, *run.slo)
    done = req[req["state"] == "FINISHED"]
    rate, rate_source = request_rate(run)
    backend = f"testbed-{run.backend}"
    out = {
        "date": run.started.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend, "backend": backend,
        "label": f"{backend}-{run.name_of('policy')}",
        "model_id": run.name_of("model"), "tokenizer_id": None,
        "num_prompts": len(req),
        "request_rate": rate,
        "burstiness": run.config["trace"]["burstiness"] if synthesized(run) else None,
        "max_concurrency": None,  # no client-side cap: every request is sent at its arrival
        "duration": m["duration_s"],
        **{k: m[k] for k in ("completed", "failed", "total_input_tokens", "total_output_tokens",
                             "request_throughput", "request_goodput", "output_throughput",
                             "total_token_throughput")},
        "max_output_tokens_per_s": peak_output_rate(done),
        "max_concurrent_requests": peak_concurrency(done),
    }
    if detailed:
        out.update(per_request_lists(req))
    samples = latency_samples(done)
    for metric in LATENCIES:
        out.update(latency_stats(metric, samples[metric], percentiles))
    slo = dict(zip(("ttft_ms", "tpot_ms", "e2e_ms"), run.slo))
    out["testbed"] = {
        "run_dir": str(run.path), "complete": run.summary.get("complete"), "error": run.summary.get("error"),
        "backend": run.backend, "policy": run.name_of("policy"), "trace": run.name_of("trace"),
        "started_at": run.started.isoformat(), "started_at_source": run.started_from,
        "request_rate_source": rate_source, "offered_rate": _finite_or_none(offered_rate(req)),
        "slo": slo, "slo_attainment": m.get("slo_attainment"),
        "rejected": m["rejected"], "aborted": m["aborted"], "errors": m["errors"], "unfinished": m["unfinished"],
        "times": "seconds from run start, simulated" if run.backend == "sim" else "seconds from run start, wall clock",
    }
    return out


def _finite_or_none(x: float):
    return float(x) if math.isfinite(x) else None
