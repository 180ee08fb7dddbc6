"""What rank 0 sends to the other ranks each step, and the plan hash for the debug check."""
from __future__ import annotations

import hashlib

import numpy as np


def batch_hash(hb) -> str:
    """Digest of everything a rank executes for a step (token ids, positions, KV slots, sampling rows)."""
    h = hashlib.sha1()
    fb = hb.fb
    for t in (fb.input_ids, fb.positions, fb.qo_indptr, fb.kv_indptr, fb.kv_indices, fb.out_cache_loc):
        h.update(t.numpy().tobytes())
    for a in (hb.pending_at, hb.pending_rows, hb.sample_idx, hb.sample_rows, hb.sample_steps):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def check_same_plan(hb, group, rank: int) -> None:
    """Debug (engine.debug_plan_hash): every rank runs the same step, or all stop."""
    import torch.distributed as dist
    mine = batch_hash(hb)
    world = dist.get_world_size(group)
    got = [None] * world
    dist.all_gather_object(got, mine, group=group)
    if len(set(got)) != 1:
        raise RuntimeError(f"tensor-parallel ranks disagree on the step: plan hashes {got}")
