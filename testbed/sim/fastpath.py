"""The simulator's fast path: a steady stretch of decode steps run at once.

After each step the step loop hands its plan here (StepLoop.steady). When the scheduler says
the next steps repeat it (testbed/scheduler/repeat.py: a decode of every running request that
the policy would plan again, each request dropping out after its last token, the free pages
enough), this module places those steps on the modelled timeline one after another with the
executor's own arithmetic (SimExecutor.place) and the loop's (each wait lands the clock where
the SimPy driver's timeout would), until the next arrival would be admitted; then the
scheduler applies them at once, their step rows go to the log in bulk, and the loop waits
once, until the clock the one-by-one loop would have reached (a stretch whose one wait would
land an ulp off it, which float arithmetic allows early in a run, is left to the one-by-one
loop: `land`). Step times, token times, rows
and ends are those of stepping one by one, float for float (tests/test_fastpath.py compares
the runs' files byte for byte); `backend.fast_path=false` turns it off.
"""
from __future__ import annotations

import math
from array import array

import numpy as np

from testbed.scheduler.repeat import batch_ends, repeat_bound, repeat_decodes
from testbed.sim.costmodel.base import decode_costs
from testbed.sim.executor import SimHandle, synthetic_id, synthetic_tokens

CHUNK = 64  # steps costed at a time: a stretch usually ends at an arrival well before its bound


def land(now: float, t: float) -> float:
    """Where the SimPy driver's clock is after the loop waits until t (a timeout of t - now):
    now + (t - now), which is t itself when t - now is exact (now >= t / 2) and may be an ulp
    off it otherwise (now = 0.1944001701948989, t = 0.7052833998544062 lands on
    0.7052833998544064). So a stretch's one wait from its start lands where its steps' waits did
    only if land(start, end) == end: FastPath.run checks it."""
    return now + (t - now) if t > now else now


class FastPath:
    def __init__(self, loop, now):
        self.loop = loop  # the StepLoop (SimDriver) whose steps it runs
        self.now = now  # the simulated clock
        self.steps = 0  # steps run at once so far
        self.evicted = 0  # cache pages they evicted

    def run(self, plan, before, inflight):
        """After `plan` was launched (and, without overlap, finished; `before`: the plan
        finished in this turn with overlap): run the steady steps that follow, if any; returns
        the loop's new step in flight (a generator: it yields the one time it waits until)."""
        loop = self.loop
        sched, ex, overlap = loop.sched, loop.executor, loop.overlap
        start = self.now()
        k, left = repeat_bound(sched, plan, before, overlap, start)
        if k < 1:
            return inflight
        reqs = plan.reqs
        nxt = loop.feed.next_arrival()
        nxt = math.inf if nxt is None else nxt
        cached = np.array([r.cached_len for r in reqs], np.int64)  # step j's contexts: j - 1 tokens on
        run_ends = batch_ends(left, k)
        pend = None
        if overlap:  # the step in flight is collected in the first turn: its loop times and costs
            h, ts, tl, tld = inflight
            pend = (ts, tl, tld, h.prep_s, h.host_done, h.ready_at, h.duration, h.predicted, h.complete_cost)
        clock, free, applied = start, ex.device_free, ex.applied
        rows = []  # the collected steps' (start, end, duration, predicted, host, launch, complete)
        costs, upto = [], 0  # the costs of steps upto - len(costs) + 1 .. upto
        j = 0
        while j < k and nxt > clock:  # an arrival at or before the schedule time would be admitted
            j += 1  # this turn schedules step j
            if j > upto:  # cost the next steps, within the run of one batch that holds step j
                n = min(CHUNK, int(run_ends[np.searchsorted(run_ends, j)]) - j + 1)
                costs = list(zip(*(c.tolist() for c in decode_costs(ex.cost_model, cached[left >= j] + (j - 1), n))))
                upto = j + n - 1
            t = clock
            host, launch, device, complete = costs[j - upto - 1]
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
        if not j or land(start, clock) != clock:  # its one wait would land an ulp off the steps' (early in a run)
            return inflight
        ex.device_free, ex.applied = free, applied
        last = self._apply(plan, left, cached, rows)
        yield clock
        if not overlap:
            return None
        ts, tl, tld, prep, host_done, ready, dur, pred, cc = pend
        return SimHandle(last, synthetic_tokens(last), prep, host_done, ready, dur, pred, cc), ts, tl, tld

    def _apply(self, plan, left: np.ndarray, cached: np.ndarray, rows):
        """The turns run after `plan`: their tokens to the scheduler, their step rows to the log;
        returns the plan left in flight (None without overlap)."""
        loop, sched = self.loop, self.loop.sched
        reqs = plan.reqs
        evicted_before = sched.stats_of(plan).evicted_pages
        k = len(rows)
        b = len(reqs)
        s = np.arange(k) + (0 if loop.overlap else 1)  # the steps collected, numbered from the plan's
        d0 = np.array([r.device_len for r in reqs], np.int64) + (0 if loop.overlap else 1)  # the first id's length
        tokens = synthetic_id(np.array([r.rid for r in reqs], np.int64)[:, None], d0[:, None] + np.arange(k))
        cols = [array("d", c) for c in zip(*rows)]  # start, end (the tokens' times), duration, ...
        times = cols[1]
        # each collected step's batch (left >= its number) and KV read: its contexts + its tokens
        by_left = np.argsort(left, kind="stable")
        at = np.searchsorted(left[by_left], s)  # items whose last step is before s
        size = b - at
        ctx = np.concatenate([np.cumsum(cached[by_left][::-1])[::-1], [0]])[at] + s * size
        last, kv = repeat_decodes(sched, reqs, left, k, tokens, times, loop.overlap)
        new_evicted = kv.pop("evicted")  # each new step's; with overlap the rows start at the last plan's
        evicted = np.concatenate([[evicted_before], new_evicted[:-1]]) if loop.overlap else new_evicted
        zeros = np.zeros(k, np.int64)
        loop.steps.extend(
            step=plan.step_id + s, start_s=cols[0], end_s=cols[1], duration_s=cols[2],
            predicted_s=cols[3].tolist(), host_s=cols[4], launch_s=cols[5], complete_s=cols[6], batch_reqs=size,
            prefill_reqs=zeros, prefill_tokens=zeros, decode_reqs=size, decode_tokens=size, context_tokens=ctx,
            waiting=zeros + len(sched.waiting), evicted_pages=evicted, preempted=zeros, admitted=zeros, **kv)
        self.steps += k
        self.evicted += int(new_evicted.sum())
        loop.steps.output_tokens += int(size.sum())
        if loop._rows is not None:
            loop._stream_ended()
        if loop.progress is not None:
            loop.progress(len(sched.done), len(loop.requests), times[-1], loop.steps.output_tokens)
        return last
