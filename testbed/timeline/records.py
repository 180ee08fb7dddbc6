"""Turn ledger objects into output rows."""
from __future__ import annotations


from testbed.core import Request


def request_row(r: Request, keep_output_ids: bool) -> dict:
    n_out = len(r.output_ids)
    ttft = r.first_token - r.arrival if r.first_token is not None else None
    e2e = r.finish_time - r.arrival if (r.finish_time is not None and n_out) else None
    tpot = (e2e - ttft) / (n_out - 1) if (e2e is not None and ttft is not None and n_out > 1) else None
    return {
        "rid": r.rid, "state": r.state.name, "finish_reason": r.finish_reason, "reject_reason": r.reject_reason,
        "priority": r.priority, "arrival_s": r.arrival, "first_scheduled_s": r.first_scheduled,
        "first_token_s": r.first_token, "finish_s": r.finish_time, "prompt_tokens": r.prompt_len,
        "output_tokens": n_out, "max_new_tokens": r.max_new_tokens, "prefix_cached_tokens": r.prefix_hit_tokens,
        "recomputed_tokens": r.recomputed_tokens, "prefill_chunks": len(r.chunk_times),
        "chunk_times_s": [t for t, _ in r.chunk_times], "chunk_tokens": [n for _, n in r.chunk_times],
        "preemptions": r.num_preemptions,
        "queue_s": r.first_scheduled - r.arrival if r.first_scheduled is not None else None,
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
        "token_times_s": r.token_times,  # the ledger's array('d'), copied whole by RequestRows (a list: 80x slower)
        "output_ids": list(r.output_ids) if keep_output_ids else None,
        "error": None, "response_id": None, "tokenized_s": r.tokenized, "queued_s": r.queued_at,
    }


