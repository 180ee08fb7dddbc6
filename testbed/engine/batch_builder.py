"""Turn an applied BatchPlan and the scheduler's page table into a ForwardBatch.

Token ids come from the ledger, except a decode's input token when the step that sampled
it may still be in flight (overlap): that one is read on the device from `last_token`,
which every step's sampler writes, so the CPU never waits for it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from testbed.core import BatchPlan
from testbed.engine.forward_batch import ForwardBatch


@dataclass
class HostBatch:
    fb: ForwardBatch  # on the host; moved to the device by the executor
    pending_at: np.ndarray  # flat token indices whose id is the request's last sampled token
    pending_rows: np.ndarray  # page-table rows to read those from
    sample_idx: np.ndarray  # batch rows that sample a token
    sample_rows: np.ndarray  # their page-table rows (where last_token is written)
    sample_steps: np.ndarray  # their output index (seeds the per-request sampler)


def build_host_batch(plan: BatchPlan, page_table: np.ndarray, page_size: int) -> HostBatch:
    reqs, ns, cached = plan.reqs, plan.num_tokens, plan.cached_lens.tolist()
    B = len(reqs)
    ext = np.asarray(ns, dtype=np.int64)
    ctx = plan.cached_lens + ext
    qo_indptr = np.zeros(B + 1, np.int32)
    np.cumsum(ext, out=qo_indptr[1:])
    kv_indptr = np.zeros(B + 1, np.int32)
    np.cumsum(ctx, out=kv_indptr[1:])
    T = int(qo_indptr[-1])
    ids = np.zeros(T, np.int64)
    pending_at, pending_rows = [], []
    kv_parts = []
    for i, (r, n, c) in enumerate(zip(reqs, ns, cached)):
        kv_parts.append(page_table[r.row, : c + n])
        known = r.prompt_len + len(r.output_ids)
        q0 = int(qo_indptr[i])
        if c + n <= known:
            if n == 1 and c >= r.prompt_len:  # a decode of a delivered token
                ids[q0] = r.output_ids[c - r.prompt_len]
            else:
                ids[q0:q0 + n] = r.token_slice(c, c + n)
        else:  # a decode whose input is the token sampled by a step in flight
            assert n == 1 and c == known, (r.rid, n, c, known)
            pending_at.append(q0)
            pending_rows.append(r.row)
    kv_indices = np.concatenate(kv_parts) if kv_parts else np.zeros(0, np.int64)
    # positions: c, c+1, ..., c+n-1 per request, vectorised
    positions = np.arange(T, dtype=np.int64) - np.repeat(qo_indptr[:-1].astype(np.int64) - plan.cached_lens, ext)
    out_loc = kv_indices[np.repeat(kv_indptr[1:] - ext, ext) + (np.arange(T) - np.repeat(qo_indptr[:-1], ext))]
    sample_idx = np.flatnonzero(plan.samples)
    sample_rows = np.fromiter((reqs[i].row for i in sample_idx), np.int64, len(sample_idx))
    sample_steps = np.fromiter((reqs[i].device_len - 1 - reqs[i].prompt_len for i in sample_idx), np.int64,
                               len(sample_idx))
    is_decode = bool(np.all(ext == 1))
    fb = ForwardBatch(
        input_ids=torch.from_numpy(ids), positions=torch.from_numpy(positions),
        qo_indptr=torch.from_numpy(qo_indptr), kv_indptr=torch.from_numpy(kv_indptr),
        kv_indices=torch.from_numpy(kv_indices.astype(np.int32)),
        out_cache_loc=torch.from_numpy(out_loc.astype(np.int32)), is_decode=is_decode, page_size=page_size)
    return HostBatch(fb, np.asarray(pending_at, np.int64), np.asarray(pending_rows, np.int64), sample_idx,
                     sample_rows, sample_steps)
