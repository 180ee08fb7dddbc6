"""The one scheduler core both drivers use.

Per step: `schedule(now)` hands the policy a read-only view, validates the plan it returns
and applies it (admission with prefix match, eviction, preemption by recompute, page
allocation, ledger advance); the driver runs the plan on its executor; `complete(plan,
result, now)` delivers the sampled tokens, finishes requests on EOS or length, and caches
or frees their KV. A step may still be in flight when the next one is scheduled (overlap):
the ledger advances at schedule time, KV of a request is released only once no step in
flight touches it, and a request in flight is never preempted.

The work is split: rows.py (page-table rows), cache_manager.py (prefix match, lock, share,
release, eviction), prefill.py (waiting queue, admissions, making room), decode.py (ledger
advance, results, ends), validate.py (the plan check), repeat.py (repeated decode steps
applied at once, for the simulator's fast path). This class owns the queues and counters and
calls them in order.
"""
from __future__ import annotations

from testbed.core import BatchPlan, Request, RequestState, SchedulerView, StepResult
from testbed.kv import PageAllocator, make_prefix_cache
from testbed.scheduler.cache_manager import CacheManager
from testbed.scheduler.config import SchedulerConfig
from testbed.scheduler.decode import DecodeManager
from testbed.scheduler.prefill import PrefillAdder
from testbed.scheduler.rows import RowManager
from testbed.scheduler.stats import StepStats
from testbed.scheduler.validate import validate_plan
from testbed.scheduler.view import ReadOnlySequence, StepView


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, policy, eviction_key=None):
        cfg.validate()
        self.cfg = cfg
        self.policy = policy
        self.page_size = cfg.page_size
        self.allocator = PageAllocator(cfg.num_pages, cfg.page_size)
        self.cache = make_prefix_cache(cfg.cache, cfg.page_size, eviction_key)
        self.rows = RowManager(cfg.limits.max_running, cfg.max_context, cfg.page_size)
        self.page_table = self.rows.page_table  # what the engine's batch builder reads
        self.kv = CacheManager(self.cache, self.allocator, self.rows)
        self.waiting: list[Request] = []  # WAITING and PREEMPTED, sorted by (arrival, rid)
        self.running: list[Request] = []  # admission order
        self.done: list[Request] = []  # terminal, in the order they ended
        self.prefill = PrefillAdder(self.waiting, self.running, self.rows, self.kv, policy)
        self.decode = DecodeManager(self.running, self.done, self.kv)
        self.step_id = 0
        self.num_preemptions = 0
        self.inflight_steps = 0
        self._plan_stamp = 0
        self._stats: dict[int, StepStats] = {}  # steps in flight, and the last one completed

    # ---- requests in and out ------------------------------------------------------------
    def add_request(self, r: Request, now: float) -> None:
        """Queue a new request, or reject it at once if it can never run."""
        reason = self._never_fits(r)
        if reason:
            r.reject_reason = reason
            self.decode.end(r, RequestState.REJECTED, "rejected", now)
            return
        r.state = RequestState.WAITING
        self.prefill.enqueue(r)

    def _never_fits(self, r: Request) -> str | None:
        if r.max_len > self.cfg.max_context:
            return (f"prompt {r.prompt_len} + max_new_tokens {r.max_new_tokens} tokens exceeds the model "
                    f"context {self.cfg.max_context}")
        need = -(-(r.max_len - 1) // self.page_size)
        if need > self.cfg.num_pages:
            return f"needs {need} KV pages, the pool has {self.cfg.num_pages}"
        return None

    def abort(self, r: Request, now: float, reason: str = "abort") -> None:
        """End a request at any time from outside the step: "abort" (its client is gone), or
        "stop" (finished: a stop string found in its text). KV is freed once no step in flight
        uses it."""
        if reason not in ("abort", "stop"):
            raise ValueError(f"abort reason {reason!r} is invalid; allowed: abort, stop")
        if r.is_done:
            return
        if r.state in (RequestState.WAITING, RequestState.PREEMPTED):
            self.prefill.dequeue(r)
        elif r.state == RequestState.RUNNING:
            self.running.remove(r)
        self.decode.end(r, RequestState.ABORTED if reason == "abort" else RequestState.FINISHED, reason, now)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ---------------------------------------------------------------------
    def view(self, now: float) -> SchedulerView:
        # Only with a step in flight can a running request have all its tokens scheduled
        # (its last one pending). The queues go out behind read-only windows, not copied.
        running = self.running
        if self.inflight_steps:
            running = [r for r in running if r.device_len < r.prompt_len + r.max_new_tokens]
        limits = self.cfg.limits
        return StepView(now, self.step_id, ReadOnlySequence(self.waiting), ReadOnlySequence(running),
                        limits.max_running, self.rows.num_free, limits.max_step_tokens, self.page_size,
                        self.cfg.num_pages, self.allocator.free_pages, self.cache.evictable_pages, self.num_preemptions,
                        self.cache.peek_cost)

    def schedule(self, now: float) -> BatchPlan | None:
        """Plan and apply the next step, or None if there is nothing to run now."""
        view = self.view(now)
        plan = self.policy.make_plan(view)
        self._plan_stamp += 1  # a fresh mark for each plan checked (plans may come to nothing)
        validate_plan(plan, self.rows.owners, self._plan_stamp, self.cfg.limits.max_step_tokens)
        st = StepStats(self.step_id)
        for r in plan.preempt:
            self.prefill.preempt(r, now)
        st.admitted, st.deferred, preempted, st.evicted_pages = self.prefill.fit(plan, view, now)
        st.preempted = len(plan.preempt) + preempted
        self.num_preemptions += st.preempted
        st.decode_reqs, st.prefill_reqs, st.prefill_tokens = self.decode.advance(plan, now)
        st.decode_tokens = st.decode_reqs
        if not len(plan):
            return None
        plan.step_id = self.step_id
        self._stats[plan.step_id] = st
        self.step_id += 1
        self.inflight_steps += 1
        return plan

    def stats_of(self, plan: BatchPlan) -> StepStats:
        """The scheduler's figures for a step, until the step after it completes."""
        return self._stats[plan.step_id]

    def skip_steps(self, k: int, last: StepStats) -> int:
        """k steps were scheduled and applied at once (repeat.py); `last`: the figures of the
        k-th, the only one that may still be recorded. Returns its step id."""
        self.step_id += k
        last.step_id = self.step_id - 1
        self._stats = {last.step_id: last}
        return last.step_id

    # ---- after a step -------------------------------------------------------------------
    def complete(self, plan: BatchPlan, result: StepResult, now: float) -> list[Request]:
        """Apply a finished step's result; returns the requests that ended in it."""
        self.inflight_steps -= 1
        self._stats.pop(plan.step_id - 1, None)
        tokens = result.tokens
        n_samples = plan.num_samples
        if tokens is None or len(tokens) != n_samples:
            raise ValueError(f"step {plan.step_id}: expected {n_samples} tokens, got "
                             f"{None if tokens is None else len(tokens)}")
        ended = self.decode.complete(plan, tokens, now)
        if self.cfg.check_every_step:
            self.check_integrity()
        return ended

    # ---- checks -----------------------------------------------------------------------
    def live_requests(self) -> list[Request]:
        """Requests holding KV: running, and ended ones a step in flight still uses."""
        return self.decode.live()

    def check_integrity(self) -> dict:
        """free + cached + in use == total, no page in two places, no running request's
        shared prefix lost, and every live request's lengths in range."""
        return self.kv.check(self.live_requests(), self.waiting)
