"""The simulator's fast path: a steady stretch of decode steps run at once.

After each step the step loop hands its plan here (StepLoop.steady). When the scheduler says
the next steps repeat it (testbed/scheduler/repeat.py: a decode of every running request that
the policy would plan again, no request ending inside, the free pages enough), this module
places those steps on the modelled timeline one after another with the executor's own
arithmetic (SimExecutor.place) and the loop's (each wait lands the clock where the SimPy
driver's timeout would), until the next arrival would be admitted; then it applies them to
the scheduler at once, appends their step rows in bulk and waits once, until the clock the
one-by-one loop would have reached. Step times, token times, rows and finishes are those of
stepping one by one, float for float (tests/test_fastpath.py compares the runs' files byte
for byte); `backend.fast_path=false` turns it off.
"""
from __future__ import annotations

import math
from array import array

import numpy as np

from testbed.scheduler.repeat import new_pages, repeat_bound, repeat_decodes
from testbed.sim.costmodel.base import decode_costs
from testbed.sim.executor import SimHandle, synthetic_id

CHUNK = 64  # steps costed at a time: a stretch usually ends at an arrival well before its bound


def land(now: float, t: float) -> float:
    """Where the SimPy driver's clock is after the loop waits until t (a timeout of t - now):
    t itself for 0 <= now <= t (tests/test_fastpath.py), so the one wait at the end of a
    stretch lands where its steps' waits did."""
    return now + (t - now) if t > now else now


class FastPath:
    def __init__(self, loop, now):
        self.loop = loop  # the StepLoop (SimDriver) whose steps it runs
        self.now = now  # the simulated clock
        self.steps = 0  # steps run at once so far

    def run(self, plan, before, inflight):
        """After `plan` was launched (and, without overlap, finished; `before`: the plan
        finished in this turn with overlap): run the steady steps that follow, if any; returns
        the loop's new step in flight (a generator: it yields the one time it waits until)."""
        loop = self.loop
        sched, ex, overlap = loop.sched, loop.executor, loop.overlap
        start = self.now()
        k = repeat_bound(sched, plan, before, overlap, start)
        if k < 1:
            return inflight
        reqs = plan.reqs
        b = len(reqs)
        nxt = loop.feed.next_arrival()
        nxt = math.inf if nxt is None else nxt
        cached = np.array([r.cached_len for r in reqs], np.int64)
        pend = None
        if overlap:  # the step in flight is collected in the first turn: its loop times and costs
            h, ts, tl, tld = inflight
            pend = (ts, tl, tld, h.prep_s, h.host_done, h.ready_at, h.duration, h.predicted, h.complete_cost)
        clock, free, applied = start, ex.device_free, ex.applied
        rows = []  # the collected steps' (start, end, duration, predicted, host, launch, complete)
        costs = None
        j = 0
        while j < k and nxt > clock:  # an arrival at or before the schedule time would be admitted
            if j % CHUNK == 0:
                costs = list(zip(*(c.tolist() for c in decode_costs(ex.cost_model, cached + j, min(CHUNK, k - j)))))
            t = clock
            host, launch, device, complete = costs[j % CHUNK]
            prep, host_done, ready, dur, free, applied = ex.place(t, host, launch, device, complete, free, applied)
            clock = land(clock, host_done)
            cur = (t, t, clock, prep, host_done, ready, dur, device, complete)
            ts, tl, tld, f_prep, _, f_ready, f_dur, f_pred, f_cc = pend if overlap else cur
            clock = land(clock, f_ready)
            tc = clock
            if f_cc:
                clock = land(clock, tc + f_cc)
            rows.append((ts, tc, f_dur, f_pred, (tl - ts) + f_prep, max(0.0, tld - tl - f_prep), clock - tc))
            pend = cur
            j += 1
        if not j:
            return inflight
        pages = new_pages(sched, reqs, j)
        self._record(sched, reqs, plan.step_id + (0 if overlap else 1), rows, np.cumsum(pages[1].sum(axis=1)))
        d0 = np.array([r.device_len for r in reqs], np.int64) + (0 if overlap else 1)  # the first id's length
        times = array("d", [r[1] for r in rows])
        tokens = synthetic_id(np.array([r.rid for r in reqs], np.int64)[:, None], d0[:, None] + np.arange(j))
        last = repeat_decodes(sched, reqs, j, pages, tokens, times, overlap)
        ex.device_free, ex.applied = free, applied
        self.steps += j
        loop.steps.output_tokens += b * j
        if loop.progress is not None:
            loop.progress(len(sched.done), len(loop.requests), times[-1], loop.steps.output_tokens)
        yield clock
        if not overlap:
            return None
        ts, tl, tld, prep, host_done, ready, dur, pred, cc = pend
        handle = SimHandle(last, synthetic_id(np.array([r.rid for r in reqs], np.int64),
                                              np.array([r.device_len for r in reqs], np.int64)),
                           prep, host_done, ready, dur, pred, cc)
        return handle, ts, tl, tld

    def _record(self, sched, reqs, first: int, rows, pages: np.ndarray) -> None:
        """The collected steps' rows (ids from `first`), as record_step writes each: every one a
        decode of the same requests, its KV counts as they stand when it is recorded, the j-th
        after j new steps took pages[j - 1] pages (with overlap the step after it is scheduled)."""
        b, k = len(reqs), len(rows)
        kv0 = sum(r.cached_len for r in reqs) - (b if self.loop.overlap else 0)  # the first collected step's
        cols = list(zip(*rows))
        ints = np.full(k, 1, np.int64)
        sched_stats = {"batch_reqs": b, "prefill_reqs": 0, "prefill_tokens": 0, "decode_reqs": b,
                       "decode_tokens": b, "running": len(sched.running), "waiting": len(sched.waiting),
                       "pages_cached": sched.cache.cached_pages, "evicted_pages": 0, "preempted": 0, "admitted": 0}
        self.loop.steps.extend(
            step=np.arange(first, first + k), start_s=cols[0], end_s=cols[1], duration_s=cols[2],
            predicted_s=list(cols[3]), host_s=cols[4], launch_s=cols[5], complete_s=cols[6],
            context_tokens=kv0 + b + b * np.arange(k), pages_used=sched.kv.owned_pages + pages,
            pages_free=sched.allocator.free_pages - pages, **{c: ints * v for c, v in sched_stats.items()})
