"""Repeated decode steps: when a step's plan was a decode of every running request and nothing
else, and the policy says such a plan repeats while nothing arrives, ends or is evicted
(Policy.decodes_repeat), the next steps are that plan again, each request dropping out after
its last token. This module bounds how many (the free pages cover the new ones, or with
nobody waiting the free and evictable ones; with someone waiting no request may end and no
page be evicted: either changes what an admission reads) and applies them to the ledger and
the KV at once, as that many calls of schedule and complete would: the same page ids and
evictions, the requests ended and their KV released in the same order between the same
allocations. The simulator's fast path (testbed/sim/fastpath.py) owns the clock and the rows.

Steps are numbered from the last plan: step j is the j-th after it. Request i runs in steps
1..left[i] (left[i]: its tokens still to schedule) and ends when step left[i] completes: with
overlap in turn left[i] + 1 (a turn schedules step j, then completes step j - 1; step 0, the
last plan, is in flight when the run starts), without it in turn left[i].
"""
from __future__ import annotations

import numpy as np

from testbed.core import BatchPlan
from testbed.scheduler.stats import StepStats


def is_decode_of(sched, plan: BatchPlan, reqs, evicting: bool) -> bool:
    """plan ran exactly `reqs` (the same objects, in order), each a decode, and nothing else
    happened in its scheduling (no admission or preemption; no eviction unless `evicting`)."""
    st = sched.stats_of(plan)
    return (len(plan.reqs) == len(reqs) and st.decode_reqs == len(reqs) and not (
        st.admitted or st.preempted or (st.evicted_pages and not evicting) or st.deferred or plan.preempt)
        and all(a is b for a, b in zip(plan.reqs, reqs)))


def repeat_bound(sched, plan: BatchPlan, before: BatchPlan | None, overlap: bool, now: float
                 ) -> tuple[int, np.ndarray]:
    """(turns that are sure to repeat `plan` if nothing arrives, each request's `left`). plan:
    the last one scheduled (with overlap still in flight; `before`: the one completed since).
    0 turns unless plan is a decode of every running request the policy would plan again and,
    with overlap and someone waiting, `before` was a decode of the same (its completion, after
    plan was made, ended none and changed no KV an admission reads). With someone waiting no
    request may end inside and no page be evicted (either changes what an admission reads);
    with nobody, one request at least runs on after the last turn, and the steps may evict
    cache pages as the scheduler does. The pages the steps need must be free (or evictable) now:
    no preemption."""
    running = sched.running
    none = 0, np.zeros(0, np.int64)
    waiting = bool(sched.waiting)
    if sched.cfg.check_every_step or not running or not is_decode_of(sched, plan, running, not waiting):
        return none
    if overlap and waiting and (before is None or not is_decode_of(sched, before, running, False)):
        return none
    if not sched.policy.decodes_repeat(sched.view(now)):
        return none
    left = np.array([r.prompt_len + r.max_new_tokens - r.device_len for r in running], np.int64)
    k = int(left.min() if waiting else left.max())
    k -= 0 if overlap else 1  # without overlap a step's request ends in the step's own turn
    pool = sched.allocator.free_pages + (0 if waiting else sched.cache.evictable_pages)
    if k > 0 and int(np.minimum(left, k).sum()) > pool:  # a decode takes <= 1 page a step
        k = pool // len(running)
    return max(k, 0), left


def batch_ends(left: np.ndarray, k: int) -> np.ndarray:
    """The last step of each run of one batch among steps 1..k (step j's batch: the items with
    left >= j), ascending, k the last."""
    return np.unique(np.concatenate([left[(left >= 1) & (left < k)], [k]]))


def repeat_decodes(sched, reqs, left: np.ndarray, k: int, tokens: np.ndarray, times, overlap: bool
                   ) -> tuple[BatchPlan | None, dict[str, np.ndarray]]:
    """Apply k turns of repeated decodes of `reqs` (the running requests, as the last plan ran
    them; left: as repeat_bound's): each request's KV and tokens (tokens[i]: the ids it is
    delivered, at `times`, the collect times of the turns), the requests ended and released in
    the turns they end, the step ids, the stats and the policy's per-step state. Returns the
    plan left in flight with overlap (None without), and the scheduler's part of each turn's
    step row as the turn leaves it: running, pages_used, pages_cached, pages_free, and
    `evicted`: the pages each step 1..k evicted."""
    b = len(reqs)
    run = np.minimum(left, k)  # steps each request runs
    got = np.minimum(left, k - 1) + 1 if overlap else run  # tokens delivered: with overlap step 0's too
    first = times[0]
    for r, ids, n, g in zip(reqs, tokens.tolist(), run.tolist(), got.tolist()):
        r.cached_len += n
        r.device_len += n
        r.output_ids.extend(ids[:g])
        r.token_times.extend(times[:g])
        if r.first_token is None:
            r.first_token = first
    ends = left + (1 if overlap else 0)  # the turn each request ends in
    # pages held after each step (k x items; fixed once a request stops), the new ones step-major
    # (the order k allocations in a row take them in: step by step, in plan order)
    P = sched.page_size
    c0 = np.array([r.cached_len for r in reqs], np.int64) - run
    h0 = np.array([r.num_pages for r in reqs], np.int64)
    after = np.maximum(h0, -(-(c0 + np.minimum(np.arange(1, k + 1)[:, None], left)) // P))
    held = np.vstack([h0, after[:-1]])
    step, item = np.nonzero(after - held)  # decodes: at most one new page an item a step
    row_of = np.array([r.row for r in reqs], np.int64)[item]
    slot = held[step, item] * P
    by_turn = np.searchsorted(step, np.arange(k + 1))  # new pages of steps before each turn's (0-based)
    cols = {c: np.empty(k, np.int64) for c in ("running", "pages_used", "pages_cached", "pages_free")}
    evicted = np.zeros(k, np.int64)
    done = 0  # turns applied
    for turn in sorted({int(e) for e in ends if e <= k} | {k}):
        lo, hi = by_turn[done], by_turn[turn]
        if hi - lo <= sched.allocator.free_pages:  # one allocation gives what one a step would
            if hi > lo:
                _write_pages(sched.page_table.table, row_of[lo:hi], slot[lo:hi], sched.kv.alloc(int(hi - lo))[0], P)
            taken = by_turn[done + 1: turn + 1] - lo  # pages the turns took, cumulated
            cols["pages_used"][done:turn] = sched.kv.owned_pages - (hi - lo) + taken
            cols["pages_free"][done:turn] = sched.allocator.free_pages + (hi - lo) - taken
            cols["pages_cached"][done:turn] = sched.cache.cached_pages
        else:  # the free pages run out: a step's allocation at a time, evicting as the scheduler's does
            for t in range(done + 1, turn + 1):
                a, z = by_turn[t - 1], by_turn[t]
                if z > a:
                    pages, evicted[t - 1] = sched.kv.alloc(int(z - a))
                    _write_pages(sched.page_table.table, row_of[a:z], slot[a:z], pages, P)
                cols["pages_used"][t - 1] = sched.kv.owned_pages
                cols["pages_free"][t - 1] = sched.allocator.free_pages
                cols["pages_cached"][t - 1] = sched.cache.cached_pages
        cols["running"][done:turn] = len(sched.running)
        for i in np.flatnonzero(ends == turn).tolist():  # in plan order, as complete ends them
            r = reqs[i]
            if left[i]:
                r.num_pages = int(after[left[i] - 1, i])
            if overlap:
                r.inflight -= 1
            sched.decode.finish(r, "length", times[turn - 1])
        # the turn's own row is written after its ends
        for c, v in (("pages_used", sched.kv.owned_pages), ("pages_free", sched.allocator.free_pages),
                     ("pages_cached", sched.cache.cached_pages), ("running", len(sched.running))):
            cols[c][turn - 1] = v
        done = turn
    for r, n in zip(reqs, after[-1].tolist()):
        if r.row >= 0:
            r.num_pages = n
    sched.policy.skip_plans(k)
    items = np.flatnonzero(left >= k)  # the last step's batch
    nb = len(items)
    last = sched.skip_steps(k, StepStats(-1, decode_reqs=nb, decode_tokens=nb, evicted_pages=int(evicted[-1])))
    cols["evicted"] = evicted
    if not overlap:
        return None, cols
    plan = BatchPlan([reqs[i] for i in items.tolist()], [1] * nb, step_id=last)
    plan.cached_lens = np.array([r.cached_len - 1 for r in plan.reqs], np.int64)
    plan.samples = np.ones(nb, bool)
    plan.num_samples = nb
    plan.kv_tokens = int(plan.cached_lens.sum()) + nb
    return plan, cols


def _write_pages(table: np.ndarray, rows: np.ndarray, slots: np.ndarray, pages: np.ndarray, P: int) -> None:
    """Map each new page into its row at its first slot (page-table slots are page * P + offset)."""
    if P == 1:
        table[rows, slots] = pages
    else:
        offs = np.arange(P)
        table[rows[:, None], slots[:, None] + offs] = pages[:, None] * P + offs
