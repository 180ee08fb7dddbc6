"""A step of a given shape without a scheduler: what the warm-up and the step profiler
launch on the real executor (same kernels, CUDA graphs, sampler).

Request i extends by ``extend[i]`` tokens over ``cached[i]`` cached ones; its context lives
in KV slots of its own (no two rows share one; a batch that does not fit the pool is an
error), so the attention reads as many distinct bytes as a real batch of that shape. The KV contents are
whatever the pool holds: timing does not depend on them."""
from __future__ import annotations

import numpy as np
import torch

from testbed.engine.batch_builder import HostBatch
from testbed.engine.forward_batch import ForwardBatch


def synthetic_host_batch(extend, cached, num_slots: int, page_size: int, vocab_size: int,
                         seed: int = 0, interleave: float = 0.0, pending: bool = False) -> HostBatch:
    """interleave: the fraction of each decode row's context (a row extending by 1 token)
    laid out as the engine's allocator lays out generated tokens: one slot per row per step,
    the slots of the rows decoding in a step side by side. A row whose tail is t tokens decoded
    in the last t of the longest tail's steps (it joined later), so a step holds the rows of the
    longest tails, in that order; rows of equal tails: token j of row i at tail + j * rows + i.
    The rest of a context is one run of consecutive slots, as a prompt allocated at once. Every
    context token has a slot of its own and no slot is left between them. Page size 1.
    pending: every decode row's input id is its row's last sampled token, gathered on the
    device as a serving step's are (the step loop launches a step before the last one's
    tokens are back on the host); the ids are whatever the executor's last tokens hold."""
    ext = np.asarray(extend, np.int64)
    cac = np.asarray(cached, np.int64)
    B = len(ext)
    ctx = ext + cac
    dec = np.flatnonzero(ext == 1) if interleave > 0 and page_size == 1 else np.zeros(0, np.int64)
    tail = np.zeros(B, np.int64)
    tail[dec] = np.floor(ctx[dec] * interleave).astype(np.int64)
    head = ctx - tail
    # each request's head starts on a page boundary, runs placed one after another; the
    # interleaved tails after them
    run = -(-head // page_size) * page_size
    need = int(run.sum()) + int(tail.sum())
    if need > num_slots:
        raise ValueError(f"a batch of {int(ctx.sum())} context tokens does not fit the pool of {num_slots} slots")
    start = np.concatenate([[0], np.cumsum(run)[:-1]])
    tail_base = int(run.sum())
    # the decode rows by tail, longest first (ties in row order): step s of the L holds the rows
    # whose tails reach back to it, a prefix of that order; a row's place in it is its column
    order = dec[np.argsort(-tail[dec], kind="stable")]
    col = np.full(B, -1, np.int64)
    col[order] = np.arange(len(order))
    L = int(tail.max(initial=0))
    desc = tail[order]
    active = np.searchsorted(-desc, -(L - np.arange(L)), side="right")  # rows with tail >= L - s
    step_at = tail_base + np.concatenate([[0], np.cumsum(active)])  # each step's first slot
    qo = np.zeros(B + 1, np.int32)
    np.cumsum(ext, out=qo[1:])
    kv = np.zeros(B + 1, np.int32)
    np.cumsum(ctx, out=kv[1:])
    parts = []
    for i in range(B):
        parts.append(np.arange(start[i], start[i] + head[i]))
        if tail[i]:
            parts.append(step_at[L - tail[i]:L] + col[i])
    kv_indices = np.concatenate(parts)
    T = int(qo[-1])
    positions = np.arange(T, dtype=np.int64) - np.repeat(qo[:-1].astype(np.int64) - cac, ext)
    out_loc = kv_indices[np.repeat(kv[1:] - ext, ext) + (np.arange(T) - np.repeat(qo[:-1], ext))]
    ids = np.random.default_rng(seed).integers(0, vocab_size, T, dtype=np.int64)
    fb = ForwardBatch(
        input_ids=torch.from_numpy(ids), positions=torch.from_numpy(positions),
        qo_indptr=torch.from_numpy(qo), kv_indptr=torch.from_numpy(kv),
        kv_indices=torch.from_numpy(kv_indices.astype(np.int32)),
        out_cache_loc=torch.from_numpy(out_loc.astype(np.int32)), is_decode=bool(np.all(ext == 1)),
        page_size=page_size)
    rows = np.arange(B, dtype=np.int64)
    dec_rows = np.flatnonzero(ext == 1) if pending else np.zeros(0, np.int64)
    return HostBatch(fb, qo[:-1][dec_rows].astype(np.int64), dec_rows, rows, rows, np.zeros(B, np.int64))


def greedy_sampling(n: int, temperature: float = 0.0) -> tuple:
    """The sampling lists (temperature, top_k, top_p, seed) of n rows."""
    return [temperature] * n, [0] * n, [1.0] * n, list(range(n))
