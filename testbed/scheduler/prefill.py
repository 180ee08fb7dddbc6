"""The waiting queue and fitting a plan into memory: admitting its new requests (with their
prefix match), then making room for its pages: dropping this step's admissions from the
end, then preempting by recompute (the policy picks the victim), and at last running fewer
of the requests a step in flight holds."""
from __future__ import annotations

import bisect


from testbed.core import BatchPlan, Request, RequestState
from testbed.scheduler.cache_manager import CacheManager
from testbed.scheduler.rows import RowManager
from testbed.scheduler.validate import PlanError


class PrefillAdder:
    def __init__(self, waiting: list[Request], running: list[Request], rows: RowManager, kv: CacheManager,
                 policy):
        self.waiting = waiting  # the scheduler's, sorted by (arrival, rid)
        self.running = running  # the scheduler's, in admission order
        self.rows = rows
        self.kv = kv
        self.policy = policy
        self._admit_seq = 0

    # ---- the waiting queue ----------------------------------------------------------------
    def enqueue(self, r: Request) -> None:
        r.queued = True
        w = self.waiting
        if not w or (w[-1].arrival, w[-1].rid) <= (r.arrival, r.rid):
            w.append(r)
        else:
            w.insert(bisect.bisect([(x.arrival, x.rid) for x in w], (r.arrival, r.rid)), r)

    def dequeue(self, r: Request) -> None:
        self.waiting.remove(r)
        r.queued = False

    # ---- one plan -------------------------------------------------------------------------
    def fit(self, plan: BatchPlan, view, now: float) -> tuple[int, int, int, int]:
        """Admit the plan's new requests and map every item's new pages, dropping from the
        plan what cannot run. Returns (admitted, items dropped, preempted, pages evicted)."""
        admitted, deferred = self._admit_all(plan, now)
        needs, held, short = self._shortfall(plan)
        while short > 0 and admitted:
            r = admitted.pop()
            self._unadmit(r)
            deferred += self._drop(plan, lambda x: x is r)
            needs, held, short = self._shortfall(plan)
        preempted = 0
        while short > 0:  # every admission is undone by now
            candidates = [r for r in self.running if not r.inflight]
            if not candidates:
                break
            victim = self.policy.choose_victim(view, candidates)
            if not any(victim is c for c in candidates):
                raise PlanError(f"choose_victim returned request {getattr(victim, 'rid', victim)}, not one of the "
                                f"preemptible running requests {[c.rid for c in candidates]}")
            deferred += self._drop(plan, lambda x: x is victim)
            self.preempt(victim, now)
            preempted += 1
            needs, held, short = self._shortfall(plan)
        while short > 0 and len(plan):  # what is left is in flight: run fewer this step
            deferred += self._drop(plan, lambda x, last=plan.reqs[-1]: x is last)
            needs, held, short = self._shortfall(plan)
        total = sum(needs)
        evicted = 0
        if total:
            pages, evicted = self.kv.alloc(total)
            self.rows.map_new_pages(plan.reqs, needs, held, pages)
        return len(admitted), deferred, preempted, evicted

    def _admit_all(self, plan: BatchPlan, now: float) -> tuple[list[Request], int]:
        """Admit the plan's waiting requests while rows last (their chunks shrink by the
        prefix hit); returns them and how many items were dropped for want of a row."""
        admitted = []
        rowless = False
        RUNNING = RequestState.RUNNING
        for i, r in enumerate(plan.reqs):
            if r.state is not RUNNING:
                if not self.rows.num_free:
                    rowless = True
                    continue
                self._admit(r)
                admitted.append(r)
                plan.num_tokens[i] = min(plan.num_tokens[i], r.extend_len)
        return admitted, (self._drop(plan, lambda r: r.state is not RUNNING) if rowless else 0)

    def _shortfall(self, plan: BatchPlan) -> tuple[list[int], list[int], int]:
        """page_needs' two lists, and how many pages more than free + evictable they need."""
        needs, held = self.rows.page_needs(plan.reqs, plan.num_tokens)
        return needs, held, sum(needs) - self.kv.available_pages

    @staticmethod
    def _drop(plan: BatchPlan, which) -> int:
        keep = [i for i, r in enumerate(plan.reqs) if not which(r)]
        dropped = len(plan) - len(keep)
        plan.reqs = [plan.reqs[i] for i in keep]
        plan.num_tokens = [plan.num_tokens[i] for i in keep]
        return dropped

    # ---- moves between the queues ---------------------------------------------------------
    def _admit(self, r: Request) -> None:
        self.rows.acquire(r)
        hit = self.kv.match(r)
        r.cached_len = hit
        r.num_pages = hit // self.rows.page_size
        if r.num_preemptions == 0:
            r.prefix_hit_tokens = hit
        else:
            r.recomputed_tokens += r.device_len - hit
        r.state = RequestState.RUNNING
        r.admit_seq = self._admit_seq
        self._admit_seq += 1
        self.dequeue(r)
        self.running.append(r)

    def _unadmit(self, r: Request) -> None:
        """Undo an admission made in this step (nothing was computed)."""
        if r.num_preemptions == 0:
            r.prefix_hit_tokens = 0
        else:
            r.recomputed_tokens -= r.device_len - r.cached_len
        self.kv.unmatch(r)
        self.rows.release(r)
        r.cached_len = r.num_pages = 0
        r.state = RequestState.PREEMPTED if r.num_preemptions else RequestState.WAITING
        self.running.remove(r)
        self.enqueue(r)

    def preempt(self, r: Request, now: float) -> None:
        """Preempt by recompute: share or free the KV, put the request back in the queue."""
        self.running.remove(r)
        self.kv.release(r)
        r.cached_len = 0
        r.state = RequestState.PREEMPTED
        r.num_preemptions += 1
        r.preempt_times.append(now)
        self.enqueue(r)
