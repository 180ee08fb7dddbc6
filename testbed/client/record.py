"""What the client knows of a request, and its requests.parquet row. Times are seconds from
the run's start on the client's wall clock. TTFT and E2E count from when the request was
sent (`sent`), as `vllm bench serve` counts them; a request that waited for a slot under
backend.max_concurrency has that wait as queue_s (vLLM's client_queue_time)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class ClientRecord:
    rid: int
    prompt_tokens: int  # the trace's; the server's usage count once it answers
    max_new_tokens: int  # the trace's output length, sent as max_tokens
    arrival: float  # the trace's arrival time
    priority: int = 0
    state: str = "WAITING"  # WAITING (for a slot) / RUNNING (sent) / FINISHED / FAILED / REJECTED
    sent: float | None = None
    first_token: float | None = None
    token_times: list = field(default_factory=list)  # the arrival of each streamed chunk with a choice
    finish: float | None = None  # the last such chunk
    output_tokens: int = 0  # usage.completion_tokens
    finish_reason: str | None = None  # the server's (length / stop), or error / rejected
    error: str | None = None
    reject_reason: str | None = None
    response_id: str | None = None

    def fail(self, why: str) -> None:
        self.state, self.finish_reason, self.error = "FAILED", "error", why


def client_row(r: ClientRecord, keep_output_ids: bool) -> dict:
    """The requests.parquet row; what a client cannot know (prefix-cache hits, recomputes,
    prefill chunks, preemptions, when the server scheduled it, the output ids) is null."""
    done = r.state == "FINISHED"
    ttft = r.first_token - r.sent if r.first_token is not None else None
    e2e = r.finish - r.sent if done else None
    n = r.output_tokens
    tpot = (e2e - ttft) / (n - 1) if done and n > 1 else None
    return {
        "rid": r.rid, "state": r.state, "finish_reason": r.finish_reason, "reject_reason": r.reject_reason,
        "priority": r.priority, "arrival_s": r.arrival, "first_scheduled_s": r.sent,
        "first_token_s": r.first_token, "finish_s": r.finish if done else None, "prompt_tokens": r.prompt_tokens,
        "output_tokens": n, "max_new_tokens": r.max_new_tokens, "prefix_cached_tokens": None,
        "recomputed_tokens": None, "prefill_chunks": None, "chunk_times_s": None, "chunk_tokens": None,
        "preemptions": None, "queue_s": r.sent - r.arrival if r.sent is not None else None,
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "token_times_s": list(r.token_times), "output_ids": None,
        "error": r.error, "response_id": r.response_id, "received_s": None, "tokenized_s": None,
    }
