"""A run as AIPerf's per-request records, profile_export.jsonl (ai-dynamo/aiperf's
MetricRecordInfo: `metadata`, `metrics` as {tag: {value, unit}}, `error`), one line per
request in rid order.

Times: request_start_ns / request_end_ns are epoch nanoseconds, the run's start (summary.json
started_at: the wall clock at t=0) plus the request's arrival / finish in the timeline; for a
simulated run the offsets are simulated seconds. Record metrics follow AIPerf's definitions:
inter_token_latency = (request_latency - time_to_first_token) / (output tokens - 1), which is
testbed's TPOT; inter_chunk_latency lists the gaps between tokens (every token is its own chunk);
output_token_throughput_per_user = 1 / inter_token_latency."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from testbed.export.rundir import RunData

ERROR_TYPES = {"REJECTED": "RequestRejected", "ABORTED": "RequestAborted"}  # else the run stopped first


def _value(v, unit: str) -> dict:
    return {"value": v, "unit": unit}


def _ms(seconds) -> float:
    return float(seconds) * 1000.0


def _finished_metrics(row) -> dict:
    times = np.asarray(row.token_times_s if row.token_times_s is not None else [], float)
    out = {
        "input_sequence_length": _value(int(row.prompt_tokens), "tokens"),
        "time_to_first_token": _value(_ms(row.ttft_s), "ms"),
        "request_latency": _value(_ms(row.e2e_s), "ms"),
        "output_token_count": _value(int(row.output_tokens), "tokens"),
        "output_sequence_length": _value(int(row.output_tokens), "tokens"),
    }
    if row.output_tokens > 1 and len(times) > 1 and row.tpot_s is not None and math.isfinite(row.tpot_s):
        gaps = np.diff(times)
        out["time_to_second_token"] = _value(_ms(gaps[0]), "ms")
        out["inter_chunk_latency"] = _value([_ms(g) for g in gaps], "ms")
        out["inter_token_latency"] = _value(_ms(row.tpot_s), "ms")
        if row.tpot_s > 0:
            out["output_token_throughput_per_user"] = _value(1.0 / float(row.tpot_s), "tokens/sec/user")
    return out


def aiperf_records(run: RunData) -> Iterator[dict]:
    req = run.requests
    base = run.started_ns

    def ns(seconds) -> int:
        return base + round(float(seconds) * 1e9)

    # a request the run stopped before it ended gets the run's last known time as its end
    last = np.nanmax(np.concatenate([req[c].to_numpy(float) for c in ("arrival_s", "finish_s", "first_token_s")]))
    worker = f"testbed-{run.backend}"
    stopped = run.summary.get("error") or "the run stopped before it finished"
    for i, row in enumerate(req.itertuples(index=False)):
        finished = row.state == "FINISHED"
        end = row.finish_s if row.finish_s is not None and math.isfinite(row.finish_s) else last
        meta = {
            "session_num": i, "x_request_id": str(row.rid), "x_correlation_id": str(row.rid),
            "conversation_id": None, "turn_index": 0,
            "request_start_ns": ns(row.arrival_s), "request_ack_ns": None, "request_end_ns": ns(end),
            "worker_id": worker, "record_processor_id": "testbed.export", "benchmark_phase": "profiling",
            "was_cancelled": row.state == "ABORTED",
            "cancellation_time_ns": ns(end) if row.state == "ABORTED" else None,
        }
        if finished:
            yield {"metadata": meta, "metrics": _finished_metrics(row), "error": None}
            continue
        kind = ERROR_TYPES.get(row.state, "RunStopped")
        message = (row.reject_reason or row.finish_reason) if row.state in ERROR_TYPES else \
            f"{row.state.lower()} when the run stopped: {stopped}"
        yield {"metadata": meta, "metrics": {"error_isl": _value(int(row.prompt_tokens), "tokens")},
               "error": {"code": None, "type": kind, "message": str(message or kind)}}
