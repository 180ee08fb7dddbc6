"""Repeated decode steps: when a step's plan was a decode of every running request and nothing
else, and the policy says such a plan repeats while nothing arrives, ends or is evicted
(Policy.decodes_repeat), the next k steps are that plan again. This module bounds k by what
the scheduler knows (no request reaches its last token, the free pages cover the new ones) and
applies k such steps to the ledger and the KV at once, as k calls of schedule and complete
would (the simulator's fast path, testbed/sim/fastpath.py, owns the clock and the step rows).
"""
from __future__ import annotations

import numpy as np

from testbed.core import BatchPlan
from testbed.scheduler.stats import StepStats


def is_decode_of(sched, plan: BatchPlan, reqs) -> bool:
    """plan ran exactly `reqs` (the same objects, in order), each a decode, and nothing else
    happened in its scheduling (no admission, preemption or eviction)."""
    st = sched.stats_of(plan)
    return (len(plan.reqs) == len(reqs) and st.decode_reqs == len(reqs) and not (
        st.admitted or st.preempted or st.evicted_pages or st.deferred or plan.preempt)
        and all(a is b for a, b in zip(plan.reqs, reqs)))


def repeat_bound(sched, plan: BatchPlan, before: BatchPlan | None, overlap: bool, now: float) -> int:
    """How many more steps like `plan` (the last one scheduled; with overlap still in flight,
    `before` the one completed since) are sure to follow if nothing arrives: 0 unless plan is
    a decode of every running request and, with overlap and someone waiting, `before` was a
    decode of the same (its completion, after plan was made, ended none and changed no KV that
    an admission reads; with nobody waiting there is no admission to change). No request may
    reach its last token inside the run (it ends on the step after), nor any step need more
    pages than are free (no eviction, no preemption)."""
    running = sched.running
    if sched.cfg.check_every_step or not running or not is_decode_of(sched, plan, running):
        return 0
    if overlap and sched.waiting and (before is None or not is_decode_of(sched, before, running)):
        return 0
    if not sched.policy.decodes_repeat(sched.view(now)):
        return 0
    left = min(r.prompt_len + r.max_new_tokens - r.device_len for r in running)
    # without overlap a step is completed in its own turn: its request's end must come after the run
    k = left if overlap else left - 1
    return min(k, sched.allocator.free_pages // len(running))  # a decode takes at most one page a step


def new_pages(sched, reqs, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(pages held before each step, k x items; new pages each step takes, k x items)."""
    P = sched.page_size
    c0 = np.array([r.cached_len for r in reqs], np.int64)
    h0 = np.array([r.num_pages for r in reqs], np.int64)
    after = np.maximum(h0, -(-(c0 + np.arange(1, k + 1)[:, None]) // P))  # held after step j (rows)
    before = np.vstack([h0, after[:-1]])
    return before, after - before


def repeat_decodes(sched, reqs, k: int, pages: tuple[np.ndarray, np.ndarray], tokens: np.ndarray, times,
                   overlap: bool) -> BatchPlan | None:
    """Apply k more decode steps of `reqs` (the running requests, as the last plan ran them)
    as schedule and complete would have: the KV of each step, its page ids handed out in the
    same order (pages: new_pages of the k steps); the tokens delivered (tokens[i]: request i's, k each, at `times`); the step
    ids, the stats and the policy's per-step state. With overlap the steps delivered are the
    one in flight and the first k - 1 of the new ones, and the k-th is left in flight: its plan
    is returned (None without overlap)."""
    held, new = pages
    total = int(new.sum())
    if total:
        pages, evicted = sched.kv.alloc(total)  # one allocation hands out what k in a row would
        assert not evicted, "repeat_bound keeps a run within the free pages"
        step, item = np.nonzero(new)  # step-major: the order k allocations would take them in
        rows = np.array([r.row for r in reqs], np.int64)[item]
        slot = held[step, item] * sched.page_size
        offs = np.arange(sched.page_size)
        sched.page_table.table[rows[:, None], slot[:, None] + offs] = pages[:, None] * sched.page_size + offs
    final = held[-1] + new[-1]
    first = times[0]
    for r, ids, n in zip(reqs, tokens.tolist(), final.tolist()):
        r.cached_len += k
        r.device_len += k
        r.num_pages = n
        r.output_ids.extend(ids)
        r.token_times.extend(times)
        if r.first_token is None:
            r.first_token = first
    sched.policy.skip_plans(k)
    b = len(reqs)
    last = sched.step_id + k - 1  # the id of the k-th new step
    sched.step_id += k
    sched._stats = {s: StepStats(s, decode_reqs=b, decode_tokens=b) for s in (last - 1, last)}
    if not overlap:
        return None
    plan = BatchPlan(list(reqs), [1] * b, step_id=last)
    plan.cached_lens = np.array([r.cached_len - 1 for r in reqs], np.int64)
    plan.samples = np.ones(b, bool)
    plan.num_samples = b
    plan.kv_tokens = int(plan.cached_lens.sum()) + b
    return plan
