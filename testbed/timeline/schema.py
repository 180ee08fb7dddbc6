"""The one output schema both drivers write: a row per request, a row per step."""
from __future__ import annotations

import pyarrow as pa

REQUESTS_SCHEMA = pa.schema([
    ("rid", pa.int64()),
    # FINISHED / ABORTED / REJECTED / FAILED (backend=http: an HTTP or connection error, a timeout) /
    # (WAITING, RUNNING, PREEMPTED if cut short)
    ("state", pa.string()),
    ("finish_reason", pa.string()),  # length / eos / abort / rejected; backend=http: the server's (length / stop), error
    ("reject_reason", pa.string()),
    ("priority", pa.int64()),
    ("arrival_s", pa.float64()),
    ("first_scheduled_s", pa.float64()),
    ("first_token_s", pa.float64()),
    ("finish_s", pa.float64()),
    ("prompt_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("max_new_tokens", pa.int64()),
    ("prefix_cached_tokens", pa.int64()),  # found in the prefix cache at first admission
    ("recomputed_tokens", pa.int64()),  # prefilled again after preemptions
    ("prefill_chunks", pa.int64()),
    ("chunk_times_s", pa.list_(pa.float64())),  # when each prefill chunk (recomputes included) was scheduled
    ("chunk_tokens", pa.list_(pa.int64())),  # and how many tokens it computed
    ("preemptions", pa.int64()),
    ("queue_s", pa.float64()),  # arrival -> first scheduled
    ("ttft_s", pa.float64()),
    ("tpot_s", pa.float64()),  # (e2e - ttft) / (output_tokens - 1)
    ("e2e_s", pa.float64()),
    ("token_times_s", pa.list_(pa.float64())),  # one per output token
    ("output_ids", pa.list_(pa.int64())),  # engine: the generated ids; simulator: null
    ("error", pa.string()),  # backend=http: why a FAILED request failed; else null
    ("response_id", pa.string()),  # backend=http: the id the server gave the response; else null
    # a server's own requests (testbed.serve), whose arrival_s is when its HTTP frontend received the
    # request: when a tokenizer worker had its ids, and when the scheduler took it into its queue (the
    # time of its admission pass between steps, at which all three are capped: a message may come
    # during the pass; a request that comes during a step waits for it, as a replay's arrival does); else null
    ("tokenized_s", pa.float64()),
    ("queued_s", pa.float64()),
])

STEPS_SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("start_s", pa.float64()),  # the loop began scheduling the step
    ("end_s", pa.float64()),  # its result was collected: its tokens are visible from here
    ("duration_s", pa.float64()),  # device time: measured (engine, CUDA events) or modelled (simulator)
    ("predicted_s", pa.float64()),  # the cost model's device time for the step
    ("host_s", pa.float64()),  # host time before the device can start it: schedule, batch build, upload
    ("launch_s", pa.float64()),  # host time enqueueing its kernels (overlaps the device)
    ("complete_s", pa.float64()),  # host time applying its result (tokens, finishes, KV release, record)
    ("batch_reqs", pa.int64()),
    ("prefill_reqs", pa.int64()),
    ("prefill_tokens", pa.int64()),
    ("decode_reqs", pa.int64()),
    ("decode_tokens", pa.int64()),
    ("context_tokens", pa.int64()),  # KV tokens the step's attention reads
    ("running", pa.int64()),
    ("waiting", pa.int64()),
    ("pages_used", pa.int64()),  # the requests' own pages (their shared prefixes are in pages_cached)
    ("pages_cached", pa.int64()),  # held by the prefix cache
    ("pages_free", pa.int64()),
    ("evicted_pages", pa.int64()),
    ("preempted", pa.int64()),
    ("admitted", pa.int64()),
])
