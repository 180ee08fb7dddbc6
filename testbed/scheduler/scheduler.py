"""The one scheduler core both drivers use.

Per step: `schedule(now)` hands the policy a read-only view, validates the plan it returns
and applies it (admission with prefix match, eviction, preemption by recompute, page
allocation, ledger advance); the driver runs the plan on its executor; `complete(plan,
result, now)` delivers the sampled tokens, finishes requests on EOS or length, and caches
or frees their KV. A step may still be in flight when the next one is scheduled (overlap):
the ledger advances at schedule time, KV of a request is released only once no step in
flight touches it, and a request in flight is never preempted.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

import numpy as np

from testbed.core import BatchPlan, Request, RequestState, SchedulerView, StepResult
from testbed.kv import PageAllocator, PageTable, check_kv_integrity, make_prefix_cache
from testbed.scheduler.view import ReadOnlySequence, StepView

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """A policy returned a plan the scheduler cannot apply (a bug in the policy)."""


@dataclass
class SchedulerConfig:
    num_pages: int = 65536
    page_size: int = 1
    max_context: int = 131072  # longest sequence (prompt + output) the model takes
    cache: str = "radix"  # radix | none
    eviction: str = "lru"
    check_every_step: bool = False  # run the KV integrity check after every step (tests, debugging)

    def validate(self) -> None:
        for key in ("num_pages", "page_size", "max_context"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r} is invalid; allowed: an integer >= 1")


@dataclass
class StepStats:
    """What happened in the scheduler for one step (a row of steps.parquet, with the driver's times)."""
    step_id: int
    prefill_reqs: int = 0
    prefill_tokens: int = 0
    decode_reqs: int = 0
    decode_tokens: int = 0
    evicted_pages: int = 0
    preempted: int = 0
    admitted: int = 0
    deferred: int = 0  # plan items dropped for lack of KV or rows


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, policy, eviction_key=None):
        cfg.validate()
        self.cfg = cfg
        self.policy = policy
        self.page_size = cfg.page_size
        self.allocator = PageAllocator(cfg.num_pages, cfg.page_size)
        self.cache = make_prefix_cache(cfg.cache, cfg.page_size, eviction_key)
        max_running = policy.cfg.max_running
        row_len = -(-cfg.max_context // cfg.page_size) * cfg.page_size
        self.page_table = PageTable(max_running, row_len)
        self.waiting: list[Request] = []  # sorted by (arrival, rid)
        self._row_owner: list[Request | None] = [None] * max_running  # page-table row -> running request
        self._stamp = 0
        self.running: list[Request] = []  # admission order
        self.done: list[Request] = []  # terminal, in the order they ended
        self._held: list[Request] = []  # terminal but KV still held by a step in flight
        self.step_id = 0
        self.num_preemptions = 0
        self._admit_seq = 0
        self.inflight_steps = 0
        self.stats: StepStats | None = None
        self._stats: dict[int, StepStats] = {}  # steps in flight

    # ---- requests in and out ------------------------------------------------------------
    def add_request(self, r: Request, now: float) -> None:
        """Queue a new request, or reject it at once if it can never run."""
        reason = self._never_fits(r)
        if reason:
            r.state = RequestState.REJECTED
            r.finish_reason = "rejected"
            r.reject_reason = reason
            r.finish_time = now
            self.done.append(r)
            return
        r.state = RequestState.WAITING
        self._enqueue(r)

    def _never_fits(self, r: Request) -> str | None:
        if r.max_len > self.cfg.max_context:
            return (f"prompt {r.prompt_len} + max_new_tokens {r.max_new_tokens} tokens exceeds the model "
                    f"context {self.cfg.max_context}")
        need = -(-(r.max_len - 1) // self.page_size)
        if need > self.cfg.num_pages:
            return f"needs {need} KV pages, the pool has {self.cfg.num_pages}"
        return None

    def _enqueue(self, r: Request) -> None:
        r.queued = True
        if not self.waiting or (self.waiting[-1].arrival, self.waiting[-1].rid) <= (r.arrival, r.rid):
            self.waiting.append(r)
        else:
            keys = [(w.arrival, w.rid) for w in self.waiting]
            self.waiting.insert(bisect.bisect(keys, (r.arrival, r.rid)), r)

    def _dequeue(self, r: Request) -> None:
        self.waiting.remove(r)
        r.queued = False

    def abort(self, r: Request, now: float) -> None:
        """Abort at any time; KV is freed once no step in flight uses it."""
        if r.is_done:
            return
        if r.state in (RequestState.WAITING, RequestState.PREEMPTED):
            self._dequeue(r)
        elif r.state == RequestState.RUNNING:
            self.running.remove(r)
        self._end(r, RequestState.ABORTED, "abort", now)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ---------------------------------------------------------------------
    def view(self, now: float) -> SchedulerView:
        # Only with a step in flight can a running request have all its tokens scheduled
        # (its last one pending). The queues go out behind read-only windows, not copied.
        running = self.running
        if self.inflight_steps:
            running = [r for r in running if r.device_len < r.prompt_len + r.max_new_tokens]
        return StepView(now, self.step_id, ReadOnlySequence(self.waiting), ReadOnlySequence(running),
                        self.page_size, self.cfg.num_pages, self.allocator.free_pages,
                        self.cache.evictable_pages, self.num_preemptions, self.cache.peek_cost)

    def schedule(self, now: float) -> BatchPlan | None:
        """Plan and apply the next step, or None if there is nothing to run now."""
        view = self.view(now)
        plan = self.policy.make_plan(view)
        self.stats = StepStats(self.step_id)
        self._validate(plan, view)
        for r in plan.preempt:
            self._preempt(r, now)
        self._apply(plan, view, now)
        if not len(plan):
            return None
        plan.step_id = self.step_id
        self._stats[plan.step_id] = self.stats
        self.step_id += 1
        self.inflight_steps += 1
        return plan

    def _validate(self, plan: BatchPlan, view: SchedulerView) -> None:
        """Checks cost O(plan): membership by state and page-table row, not by scanning queues."""
        reqs, ntoks = plan.reqs, plan.num_tokens
        if len(ntoks) != len(reqs):
            raise PlanError("plan.reqs and plan.num_tokens differ in length")
        owner = self._row_owner
        RUNNING = RequestState.RUNNING
        self._stamp += 1  # a fresh mark for each plan checked (plans may come to nothing)
        stamp = self._stamp
        for r, n in zip(reqs, ntoks):
            if r.plan_stamp == stamp:
                raise PlanError(f"request {r.rid} appears twice in the plan")
            r.plan_stamp = stamp
            if r.state is RUNNING and r.slot >= 0 and owner[r.slot] is r:
                if not (1 <= n <= r.device_len - r.cached_len) or r.device_len >= r.prompt_len + r.max_new_tokens:
                    raise PlanError(f"request {r.rid}: {n} tokens asked, {r.extend_len} can run")
            elif r.queued:
                if not (1 <= n <= r.device_len):
                    raise PlanError(f"request {r.rid}: {n} tokens asked, prompt has {r.device_len}")
            else:
                raise PlanError(f"request {r.rid} ({r.state.name}) is neither waiting nor schedulable")
        for r in plan.preempt:
            if r.state is not RUNNING or r.slot < 0 or owner[r.slot] is not r or r.inflight:
                raise PlanError(f"request {r.rid} cannot be preempted (not running, or in a step in flight)")
            if r.plan_stamp == stamp:
                raise PlanError(f"request {r.rid} is both run and preempted")

    def _apply(self, plan: BatchPlan, view: SchedulerView, now: float) -> None:
        stats = self.stats
        # 1. admissions: match the prefix and lock it before anything is evicted
        admitted = []
        rowless = False
        RUNNING = RequestState.RUNNING
        for i, r in enumerate(plan.reqs):
            if r.state is not RUNNING:
                if not self.page_table.num_free_rows:
                    rowless = True
                    continue
                self._admit(r, now)
                admitted.append(r)
                plan.num_tokens[i] = min(plan.num_tokens[i], r.extend_len)
        if rowless:  # no page-table row left for these
            self._drop(plan, lambda r: r.state is not RUNNING)
        # 2. pages needed; make room: drop new admissions from the end, then preempt
        needs, short = self._shortfall(plan)
        while short > 0 and admitted:
            r = admitted.pop()
            self._unadmit(r)
            self._drop(plan, lambda x: x is r)
            needs, short = self._shortfall(plan)
        while short > 0:  # every admission is undone by now
            candidates = [r for r in self.running if not r.inflight]
            if not candidates:
                break
            victim = self.policy.choose_victim(view, candidates)
            if not any(victim is c for c in candidates):
                raise PlanError(f"choose_victim returned request {getattr(victim, 'rid', victim)}, not one of the "
                                f"preemptible running requests {[c.rid for c in candidates]}")
            self._drop(plan, lambda x: x is victim)
            self._preempt(victim, now)
            needs, short = self._shortfall(plan)
        while short > 0 and len(plan):  # what is left is in flight: run fewer this step
            self._drop(plan, lambda x, last=plan.reqs[-1]: x is last)
            needs, short = self._shortfall(plan)
        # 3. evict, allocate, map
        total = int(needs.sum())
        if total > self.allocator.free_pages:
            freed = self.cache.evict(total - self.allocator.free_pages)
            self.allocator.free(freed)
            stats.evicted_pages += len(freed)
        if total:
            self._map_new_pages(plan, needs, self.allocator.alloc(total))
        # 4. advance the ledger
        cached, samples = [], []
        n_dec = pre_reqs = pre_tok = 0
        for r, n in zip(plan.reqs, plan.num_tokens):
            c = r.cached_len
            cached.append(c)
            d = r.device_len
            if n == 1 and c == d - 1 and d > r.prompt_len:  # a decode
                n_dec += 1
            else:
                pre_reqs += 1
                pre_tok += n
                r.chunk_times.append((now, n))
                if r.first_scheduled is None:
                    r.first_scheduled = now
            c += n
            r.cached_len = c
            if c == d:
                samples.append(True)
                r.device_len = d + 1
                r.pending_tokens += 1
            else:
                samples.append(False)
            r.inflight += 1
        plan.cached_lens = np.array(cached, np.int64)
        plan.samples = np.array(samples, bool)
        stats.decode_reqs = stats.decode_tokens = n_dec
        stats.prefill_reqs, stats.prefill_tokens = pre_reqs, pre_tok
        stats.admitted = len(admitted)

    def _shortfall(self, plan: BatchPlan) -> tuple[np.ndarray, int]:
        """Each item's new pages, and how many more than free + evictable they come to."""
        needs = self._page_needs(plan)
        return needs, int(needs.sum()) - self.allocator.free_pages - self.cache.evictable_pages

    def _page_needs(self, plan: BatchPlan) -> np.ndarray:
        """New pages each item needs for its tokens this step (and, for _map_new_pages, the
        pages each already holds)."""
        n = len(plan)
        reqs = plan.reqs
        end = np.fromiter((r.cached_len for r in reqs), np.int64, n) + np.asarray(plan.num_tokens, np.int64)
        held = self._held_pages = np.fromiter((r.num_pages for r in reqs), np.int64, n)
        P = self.page_size
        return np.maximum(0, (end if P == 1 else -(-end // P)) - held)

    def _map_new_pages(self, plan: BatchPlan, needs: np.ndarray, pages: np.ndarray) -> None:
        """Write every item's new pages into its page-table rows in one scatter."""
        P = self.page_size
        reqs = plan.reqs
        has = np.flatnonzero(needs)
        k = needs[has]
        rows = np.fromiter((reqs[i].slot for i in has.tolist()), np.int64, len(has))
        item = np.repeat(np.arange(len(has)), k)
        page_no = self._held_pages[has][item] + (np.arange(len(pages)) - np.repeat(np.cumsum(k) - k, k))
        if P == 1:
            self.page_table.table[rows[item], page_no] = pages
        else:
            offs = np.arange(P)
            self.page_table.table[rows[item][:, None], page_no[:, None] * P + offs] = pages[:, None] * P + offs
        for i, kk in zip(has.tolist(), k.tolist()):
            reqs[i].num_pages += kk

    def _drop(self, plan: BatchPlan, which) -> None:
        keep = [i for i, r in enumerate(plan.reqs) if not which(r)]
        self.stats.deferred += len(plan) - len(keep)
        plan.reqs = [plan.reqs[i] for i in keep]
        plan.num_tokens = [plan.num_tokens[i] for i in keep]

    # ---- admission, preemption, release -------------------------------------------------
    def _admit(self, r: Request, now: float) -> None:
        r.slot = self.page_table.acquire()
        self._row_owner[r.slot] = r
        ids = None
        if r.prompt_ids is not None and self.cache.shares:
            ids = r.prompt_ids if r.device_len == r.prompt_len else r.token_ids(r.device_len)
        if ids is not None:
            ids = ids[: r.device_len - 1]  # the last known token is always computed
        node, hit, pages = self.cache.match(ids, r.priority)
        if hit:
            self.cache.lock(node)
            r.cache_node = node
            self.page_table.write(r.slot, 0, self.allocator.slots_of(pages))
        r.cached_len = r.cache_owned_len = hit
        r.num_pages = hit // self.page_size
        if r.num_preemptions == 0:
            r.prefix_hit_tokens = hit
        else:
            r.recomputed_tokens += r.device_len - hit
        r.state = RequestState.RUNNING
        r.admit_seq = self._admit_seq
        self._admit_seq += 1
        self._dequeue(r)
        self.running.append(r)

    def _unadmit(self, r: Request) -> None:
        """Undo an admission made in this step (nothing was computed)."""
        if r.num_preemptions == 0:
            r.prefix_hit_tokens = 0
        else:
            r.recomputed_tokens -= r.device_len - r.cached_len
        if r.cache_node is not None:
            self.cache.unhit(r.cache_node)  # so LFU does not count an admission that did not happen
        self._unlock(r)
        self._free_row(r)
        r.slot, r.cached_len, r.num_pages, r.cache_owned_len = -1, 0, 0, 0
        r.state = RequestState.PREEMPTED if r.num_preemptions else RequestState.WAITING
        self.running.remove(r)
        self._enqueue(r)

    def _free_row(self, r: Request) -> None:
        self._row_owner[r.slot] = None
        self.page_table.release(r.slot)

    def _preempt(self, r: Request, now: float) -> None:
        """Preempt by recompute: cache or free the KV, put the request back in the queue."""
        self.running.remove(r)
        self._release_kv(r)
        r.cached_len = 0
        r.state = RequestState.PREEMPTED
        r.num_preemptions += 1
        r.preempt_times.append(now)
        self.num_preemptions += 1
        self.stats.preempted += 1
        self._enqueue(r)

    def _unlock(self, r: Request) -> None:
        if r.cache_node is not None:
            self.cache.unlock(r.cache_node)
            r.cache_node = None

    def _own_pages(self, r: Request) -> np.ndarray:
        P = self.page_size
        return self.page_table.read(r.slot, r.cache_owned_len, r.num_pages * P)[::P] // P

    def _release_kv(self, r: Request) -> None:
        """Give the request's computed prefix to the prefix cache and free the rest."""
        P = self.page_size
        row = self.page_table
        free = []
        kv_len = min(r.cached_len, r.prompt_len + len(r.output_ids))  # tokens whose ids and KV exist
        aligned = kv_len // P * P
        if r.prompt_ids is not None and self.cache.shares and aligned > r.cache_owned_len:
            pages = row.read(r.slot, 0, aligned)[::P] // P
            held = self.cache.insert(r.token_ids(aligned), pages, r.priority)
            if held > r.cache_owned_len:  # our copies of what the tree already had
                free.append(row.read(r.slot, r.cache_owned_len, held)[::P] // P)
            free.append(row.read(r.slot, aligned, r.num_pages * P)[::P] // P)
        else:
            free.append(self._own_pages(r))
        for pages in free:
            self.allocator.free(pages)
        self._unlock(r)
        self._free_row(r)
        r.slot, r.num_pages, r.cache_owned_len = -1, 0, 0

    def _cache_prefill(self, r: Request) -> None:
        """After a prefill completes, share its prompt: insert it, drop our duplicate pages,
        point the page table at the tree's pages and move the lock to the new node."""
        P = self.page_size
        kv_len = min(r.cached_len, r.prompt_len + len(r.output_ids))
        aligned = kv_len // P * P
        if r.prompt_ids is None or not self.cache.shares or aligned <= r.cache_owned_len:
            return
        ids = r.token_ids(aligned)
        pages = self.page_table.read(r.slot, 0, aligned)[::P] // P
        held = self.cache.insert(ids, pages, r.priority)
        if held > r.cache_owned_len:
            self.allocator.free(self.page_table.read(r.slot, r.cache_owned_len, held)[::P] // P)
        node, got, tree_pages = self.cache.match(ids, r.priority, count_hit=False)
        assert got == aligned, (got, aligned)
        self.page_table.write(r.slot, 0, self.allocator.slots_of(tree_pages))
        self.cache.lock(node)
        self._unlock(r)
        r.cache_node = node
        r.cache_owned_len = aligned

    # ---- after a step -------------------------------------------------------------------
    def stats_of(self, plan: BatchPlan) -> StepStats:
        """The scheduler's figures for a step, until the step after it completes."""
        return self._stats[plan.step_id]

    def complete(self, plan: BatchPlan, result: StepResult, now: float) -> list[Request]:
        """Apply a finished step's result; returns the requests that ended in it."""
        self.inflight_steps -= 1
        self._stats.pop(plan.step_id - 1, None)
        tokens = result.tokens
        n_samples = int(plan.samples.sum())
        if tokens is None or len(tokens) != n_samples:
            raise ValueError(f"step {plan.step_id}: expected {n_samples} tokens, got "
                             f"{None if tokens is None else len(tokens)}")
        ended = []
        toks = iter(tokens.tolist())
        TERMINAL = RequestState.FINISHED  # FINISHED, ABORTED, REJECTED are the largest states
        for r, n, s, c in zip(plan.reqs, plan.num_tokens, plan.samples.tolist(), plan.cached_lens.tolist()):
            r.inflight -= 1
            if s:
                tok = next(toks)
                r.pending_tokens -= 1
                if r.state >= TERMINAL:  # ended (abort, EOS) while this step was in flight: drop the token
                    r.device_len -= 1
                    r.cached_len = min(r.cached_len, r.device_len)  # no KV beyond the known tokens
                else:
                    out = r.output_ids
                    out.append(tok)
                    r.token_times.append(now)
                    if r.first_token is None:
                        r.first_token = now
                    if len(out) >= r.max_new_tokens:
                        self.running.remove(r)
                        self._end(r, RequestState.FINISHED, "length", now)
                        ended.append(r)
                    elif not r.ignore_eos and tok in r.eos_token_ids:
                        self.running.remove(r)
                        self._end(r, RequestState.FINISHED, "eos", now)
                        ended.append(r)
                    elif n > 1 or c < r.prompt_len:  # this step finished a prefill (even a 1-token chunk)
                        self._cache_prefill(r)
            if r.state >= TERMINAL and r.slot >= 0 and not r.inflight:
                self._release_kv(r)
        if self._held:
            self._held = [r for r in self._held if r.slot >= 0]
        if self.cfg.check_every_step:
            self.check_integrity()
        return ended

    def _end(self, r: Request, state: RequestState, reason: str, now: float) -> None:
        r.state = state
        r.finish_reason = reason
        r.finish_time = now
        self.done.append(r)
        if r.slot >= 0:
            if r.inflight:
                self._held.append(r)
            else:
                self._release_kv(r)

    # ---- checks -----------------------------------------------------------------------
    def live_requests(self) -> list[Request]:
        return self.running + self._held

    def check_integrity(self) -> dict:
        """free + cached + in use == total, no page in two places, no running request's
        shared prefix lost, and every live request's lengths in range."""
        P = self.page_size
        owned, shared = [], []
        for r in self.live_requests():
            if not (0 <= r.cache_owned_len <= r.cached_len <= r.device_len <= r.max_len):
                raise AssertionError(f"request {r.rid}: lengths out of order: owned {r.cache_owned_len} "
                                     f"cached {r.cached_len} device {r.device_len} max {r.max_len}")
            if r.num_pages * P < r.cached_len:
                raise AssertionError(f"request {r.rid}: {r.cached_len} cached tokens on {r.num_pages} pages")
            owned.append(self._own_pages(r))
            shared.append(self.page_table.read(r.slot, 0, r.cache_owned_len)[::P] // P)
        for r in self.waiting:
            if r.slot != -1 or r.cached_len != 0:
                raise AssertionError(f"waiting request {r.rid} holds KV")
        return check_kv_integrity(self.allocator, self.cache, owned, shared)
