"""Behaviour tests of the step loop (testbed/steploop.py) on the simulator: SimDriver runs
StepLoop on a SimPy clock, SimExecutor places each step on the modelled overlap timeline
from a stub cost model defined here.

1. random small workloads (shared prefixes, random arrivals, small KV pools that force
   preemptions, page size 1 or 4, every policy) under overlap: every request finishes with
   exactly its max_new_tokens, token times are increasing and after arrival, no KV leaks,
   and the steps log has one row per scheduled step, each with start <= end, in end order;
2. the same with aborts while a step is in flight (from the executor, between launch and
   collect): the run ends, no pages stay in use, and an aborted request never gains a token
   after its abort; 2b. the same with EOS: the token sampled for a request in the step in
   flight after its EOS is dropped;
3. the overlap timeline on a constant cost model, token times worked out by hand, with and
   without overlap; overlap never finishes later on a small workload;
4. the same inputs give the same steps table.

Throughout, the executor wrapper (Counting) checks the timeline the loop drives (collects in
launch order, never before the device is done, one step on the device at a time) and a
shadow of the KV content in device order (no step reads KV it does not own), and the loop
is bounded (a spin or a run that never ends fails instead of hanging).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies import RESERVES
from scheduler_harness import make_scheduler, req, shared
from testbed.core import RequestState
from testbed.sim.costmodel.base import StepCost
from testbed.sim.driver import SimDriver
from testbed.sim.executor import SimExecutor
from testbed.timeline.request_rows import RequestRows
from testbed.timeline.writer import requests_table

POLICIES = ["chunked", "prefill_first", "decode_first"]
MAX_CONTEXT = 64
MAX_LAUNCHES = 5_000  # a run that launches more is stuck (the workloads here need a few hundred at most)
MAX_SCHEDULES = 20_000  # the loop calls schedule once per turn: more and it spins without progress


# ---- the stub cost model and executor wrappers -----------------------------------------------
@dataclass(frozen=True)
class StubCost:
    """host, launch, device and complete seconds, each a constant plus a per-item or per-token
    term: enough to make steps differ with the batch and to be host- or device-bound."""
    host: float = 1e-3
    host_per_req: float = 1e-4
    launch: float = 5e-4
    device: float = 2e-3
    device_per_token: float = 1e-4
    device_per_cached: float = 1e-5
    complete: float = 2e-4
    wake: tuple | None = None  # (gap, host factor, launch factor, device s), as CalibratedCostModel.wake

    def step_cost(self, extend_lens, cached_lens) -> StepCost:
        n, c = np.asarray(extend_lens), np.asarray(cached_lens)
        assert len(n) == len(c) >= 1 and n.min() >= 1 and c.min() >= 0
        device = self.device + self.device_per_token * int(n.sum()) + self.device_per_cached * int(c.sum())
        return StepCost(host=self.host + self.host_per_req * len(n), launch=self.launch, device=device,
                        complete=self.complete)

    def step_time(self, extend_lens, cached_lens) -> float:
        return self.step_cost(extend_lens, cached_lens).device


class Counting:
    """Wraps an executor: counts launches and collects, fails a run that never ends, and checks
    the timeline it is driven on: steps are collected in launch order, each once, never before
    the device has finished them; on the device a step starts after the one before it ended
    and after the host's work for it, and cannot end before its kernels are enqueued.

    It also keeps a shadow of the KV: the device runs steps in launch order, each reading the
    KV slots of positions [0, cached) of its items and writing [cached, cached + n); a slot
    must hold, when read, what the request's own sequence up to that position puts there (a
    hash of the token ids), so no step reads KV freed and overwritten, or never computed."""

    def __init__(self, inner, now, sched):
        self.inner, self.now, self.sched = inner, now, sched
        self.launched: list[int] = []
        self.collected: list[int] = []
        self.device_end = 0.0
        self.kv: dict[int, int] = {}  # KV slot -> hash of the sequence up to its position
        self._hashes: dict[int, list[int]] = {}  # rid -> that hash per position

    def _content(self, r, p):
        hs = self._hashes.get(r.rid)
        if hs is None:
            hs, h = [], 0
            for q in range(r.max_len):
                tok = int(r.prompt_ids[q]) if q < r.prompt_len else sim_token(r.rid, r.prompt_len, q - r.prompt_len)
                h = hash((h, tok))
                hs.append(h)
            self._hashes[r.rid] = hs
        return hs[p]

    def _shadow(self, plan):
        table = self.sched.page_table
        items = [(r, n, c, table.read(r.row, 0, c + n).tolist())
                 for r, n, c in zip(plan.reqs, plan.num_tokens, plan.cached_lens.tolist())]
        for r, n, c, slots in items:  # reads first: no item reads what another writes in this step
            for p in range(c):
                assert self.kv.get(slots[p]) == self._content(r, p), \
                    f"step {plan.step_id}: request {r.rid} reads KV at position {p} it does not own"
        for r, n, c, slots in items:
            assert len(set(slots[c:])) == n
            for p in range(c, c + n):
                self.kv[slots[p]] = self._content(r, p)

    def launch(self, plan):
        assert len(self.launched) < MAX_LAUNCHES, "the loop does not terminate"
        t = self.now()
        self._shadow(plan)
        h = self.inner.launch(plan)
        start = h.ready_at - h.duration
        assert start >= self.device_end - 1e-12, "two steps on the device at once"
        assert start >= t + h.prep_s - 1e-12 and h.ready_at >= h.host_done - 1e-12
        assert h.host_done >= t + h.prep_s and h.host_done > t
        self.device_end = h.ready_at
        self.launched.append(plan.step_id)
        return h

    def collect(self, h):
        assert h.plan.step_id == self.launched[len(self.collected)], "steps collected out of launch order"
        assert self.now() >= h.ready_at - 1e-12, "collected before the device finished the step"
        assert self.now() >= h.host_done - 1e-12, "collected before the host launched the step"
        self.collected.append(h.plan.step_id)
        return self.inner.collect(h)


class Aborting(Counting):
    """Aborts a live request at chosen launch / collect calls: decisions[k] is (abort?, which)
    for the k-th call. At a launch the step just launched is in flight; at a collect (under
    overlap) the step launched after the one being collected is still in flight."""

    def __init__(self, inner, sched, now, decisions):
        super().__init__(inner, now, sched)
        self.decisions = decisions
        self.calls = 0
        self.aborts: dict[int, tuple[float, int]] = {}  # rid -> (abort time, outputs delivered then)

    def _maybe_abort(self):
        k, self.calls = self.calls, self.calls + 1
        if k >= len(self.decisions) or not self.decisions[k][0]:
            return
        live = self.sched.running + self.sched.waiting
        if not live:
            return
        r = live[self.decisions[k][1] % len(live)]
        if r.inflight:
            event("abort of a request in a step in flight")
        if self.sched.inflight_steps >= 2:
            event("abort with two steps in flight")
        self.aborts[r.rid] = (self.now(), len(r.output_ids))
        self.sched.abort(r, self.now())
        assert r.state == RequestState.ABORTED

    def launch(self, plan):
        h = super().launch(plan)
        self._maybe_abort()
        return h

    def collect(self, h):
        self._maybe_abort()
        return super().collect(h)


# ---- workloads ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    policy: str
    reserve: str
    page_size: int
    num_pages: int
    max_running: int
    chunk_size: int
    budget: int  # the policy's step budget: max_prefill_tokens (prefill_first, decode_first), token_budget (chunked)
    prefixes: tuple  # shared prefixes (tuples of ids)
    reqs: tuple  # (prefix index or -1, own tokens, max_new_tokens, arrival, EOS at output k or -1)
    cost: StubCost

    def scheduler(self):
        return make_scheduler(self.policy, num_pages=self.num_pages, page_size=self.page_size,
                              max_context=MAX_CONTEXT, check=True, reserve=self.reserve,
                              max_running=self.max_running, chunk_size=self.chunk_size, budget=self.budget,
                              estimate_init=0.3, estimate_min=0.05, estimate_decay=0.05)

    def requests(self, eos=False):
        """eos: requests with an EOS offset stop at that output (ignore_eos off)."""
        out = []
        for rid, (k, own, max_new, arrival, eos_at) in enumerate(self.reqs):
            # own = 0: the prompt is the shared prefix itself (whole-prompt cache hits)
            ids = None if k < 0 else shared(np.asarray(self.prefixes[k], np.int32), rid, own)
            prompt = max(own, 1) if ids is None else len(ids)
            kw = {}
            if eos and eos_at >= 0:
                kw = dict(ignore_eos=False, eos_token_ids=(sim_token(rid, prompt, eos_at),))
            out.append(req(rid, prompt, max_new, arrival=arrival, ids=ids, **kw))
        return out


def sim_token(rid, prompt_len, k):
    """The id SimExecutor samples as output k of a request (testbed.sim.executor.synthetic_tokens:
    from the rid and the position the token takes)."""
    return (rid * 1_000_003 + prompt_len + k + 1) % 1_000_000_000 + 1_000_000_000


times = st.integers(0, 40).map(lambda k: k * 2.5e-3)  # arrivals on a grid, several at once
costs = st.builds(
    StubCost,
    host=st.sampled_from([1e-4, 1e-3, 4e-3]),
    host_per_req=st.sampled_from([0.0, 1e-4, 1e-3]),
    launch=st.sampled_from([1e-5, 5e-4, 3e-3]),
    device=st.sampled_from([5e-4, 2e-3, 8e-3]),
    device_per_token=st.sampled_from([0.0, 1e-4]),
    device_per_cached=st.sampled_from([0.0, 1e-5]),
    complete=st.sampled_from([1e-5, 2e-4, 2e-3]),
)


@st.composite
def workloads(draw, max_reqs=14):
    P = draw(st.sampled_from([1, 4]))
    prefixes = tuple(tuple(draw(st.lists(st.integers(1, 50), min_size=1, max_size=16))) for _ in range(2))
    own = st.sampled_from([0, 0, 1, 2, 3, 5, 8, 12, 16])  # 0: the prompt is a shared prefix, whole
    eos_at = st.sampled_from([-1, -1, 0, 1, 3])
    reqs = draw(st.lists(st.tuples(st.integers(-1, 1), own, st.integers(1, 10), times, eos_at),
                         min_size=1, max_size=max_reqs))
    # every request must fit the pool on its own (else it is rejected); a little more than the
    # largest makes the pool contended: preemptions with reserve=estimate, waits with full
    lens = [(len(prefixes[k]) if k >= 0 else 0) + max(own, 1) + out for k, own, out, _, _ in reqs]
    need = max(-(-(n - 1) // P) for n in lens)
    num_pages = need + draw(st.integers(0, 24 // P))
    return Workload(policy=draw(st.sampled_from(POLICIES)), reserve=draw(st.sampled_from(RESERVES)),
                    page_size=P, num_pages=num_pages, max_running=draw(st.integers(1, 8)),
                    chunk_size=draw(st.sampled_from([0, 0, 1, 3, 8])), budget=draw(st.integers(2, 48)),
                    prefixes=prefixes, reqs=tuple(reqs), cost=draw(costs))


def bound_turns(sched):
    """Fail (rather than hang) a loop that turns forever: it calls schedule once per turn."""
    schedule, turns = sched.schedule, [0]

    def counted(now):
        turns[0] += 1
        assert turns[0] <= MAX_SCHEDULES, f"the loop spins at t={now}"
        return schedule(now)
    sched.schedule = counted


def run_sim(w: Workload, overlap=True, decisions=None, eos=False, rows=None):
    """rows: a RequestRows the finished requests are streamed to (StepLoop.stream_rows)."""
    sched = w.scheduler()
    bound_turns(sched)
    reqs = w.requests(eos)
    driver = SimDriver(sched, None, reqs, overlap=overlap)
    if rows is not None:
        driver.stream_rows(rows)
    env = driver.env
    inner = SimExecutor(w.cost, lambda: env.now)
    now = lambda: env.now  # noqa: E731
    ex = Counting(inner, now, sched) if decisions is None else Aborting(inner, sched, now, decisions)
    driver.executor = ex
    driver.run()
    return driver, sched, reqs, ex


def check_steps(driver, sched, ex):
    cols = driver.steps.cols
    n = len(driver.steps)
    assert n == sched.step_id == len(ex.launched) == len(ex.collected), "one row per scheduled step"
    assert list(cols["step"]) == list(range(n)) == ex.launched
    for i in range(n):
        assert cols["start_s"][i] <= cols["end_s"][i], f"step {i} ends before it starts"
        assert cols["duration_s"][i] > 0
        assert cols["duration_s"][i] <= cols["end_s"][i] - cols["start_s"][i] + 1e-12
        if i:
            assert cols["end_s"][i] >= cols["end_s"][i - 1], f"step {i} ends before step {i - 1}"
            assert cols["start_s"][i] >= cols["start_s"][i - 1]


def check_no_kv_held(sched):
    counts = sched.check_integrity()
    assert counts["in_use"] == 0 and counts["free"] + counts["cached"] == counts["total"]
    assert sched.cache.evictable_pages == sched.cache.cached_pages, "cached pages still locked"
    assert sched.inflight_steps == 0 and not sched.running and not sched.waiting and not sched.live_requests()


def check_token_times(r, driver):
    tt = r.token_times
    # a token becomes visible when its step is collected: at the end of one of the steps
    ends = set(driver.steps.cols["end_s"])
    assert all(t in ends for t in tt), (r.rid, tt)
    assert len(tt) == len(r.output_ids)
    assert all(t >= r.arrival for t in tt), (r.rid, r.arrival, tt)
    # each step is collected strictly after the one before (complete costs > 0), and a request
    # gets at most one token per step
    assert all(b > a for a, b in zip(tt, tt[1:])), (r.rid, tt)
    if tt:
        assert r.first_token == tt[0]


# ---- 1. random workloads under overlap -----------------------------------------------------------
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_random_workloads_finish_with_their_length(w):
    driver, sched, reqs, ex = run_sim(w)
    assert driver.ran_to_end
    check_no_kv_held(sched)
    check_steps(driver, sched, ex)
    assert len(sched.done) == len(reqs)
    for r in reqs:
        assert r.state == RequestState.FINISHED and r.finish_reason == "length", (r.rid, r.state, r.reject_reason)
        assert len(r.output_ids) == r.max_new_tokens
        assert r.pending_tokens == 0 and r.inflight == 0 and r.row == -1
        check_token_times(r, driver)
        assert r.finish_time == r.token_times[-1]
        if r.num_preemptions:
            event("preempted")
    # no sample is wasted: without aborts or EOS every sampled token is delivered
    assert driver.steps.output_tokens == sum(r.max_new_tokens for r in reqs)
    if any(s > 0 for s in driver.steps.cols["preempted"]):
        event("steps log shows a preemption")


# (abort?, which live request) per launch / collect call: about one call in four aborts
abort_decisions = st.lists(st.tuples(st.sampled_from([False, False, False, True]), st.integers(0, 100)),
                           min_size=8, max_size=80)


# ---- 2. aborts while a step is in flight ------------------------------------------------------------
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), decisions=abort_decisions)
def test_aborts_while_steps_are_in_flight(w, decisions):
    driver, sched, reqs, ex = run_sim(w, decisions=decisions)
    assert driver.ran_to_end
    check_no_kv_held(sched)
    check_steps(driver, sched, ex)
    assert len(sched.done) == len(reqs)
    for r in reqs:
        assert r.pending_tokens == 0 and r.inflight == 0 and r.row == -1 and r.cache_node is None
        check_token_times(r, driver)
        if r.rid in ex.aborts:
            t_abort, n_then = ex.aborts[r.rid]
            assert r.state == RequestState.ABORTED and r.finish_reason == "abort"
            assert r.finish_time == t_abort
            assert len(r.output_ids) == n_then, f"request {r.rid} gained tokens after its abort"
            assert all(t <= t_abort for t in r.token_times)
            assert len(r.output_ids) < r.max_new_tokens
        else:
            assert r.state == RequestState.FINISHED and len(r.output_ids) == r.max_new_tokens
    if ex.aborts:
        event("aborted")


# ---- 2b. EOS while the next step is in flight ----------------------------------------------------
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_eos_under_overlap_drops_the_token_in_flight(w):
    """A request that samples its EOS in step N has usually been scheduled again in step N+1
    (launched before N's tokens were seen): that token must be dropped, the request end at
    its EOS and its KV be released once N+1 completes."""
    driver, sched, reqs, ex = run_sim(w, eos=True)
    assert driver.ran_to_end
    check_no_kv_held(sched)
    check_steps(driver, sched, ex)
    for (_, _, max_new, _, eos_at), r in zip(w.reqs, reqs):
        assert r.pending_tokens == 0 and r.inflight == 0 and r.row == -1
        check_token_times(r, driver)
        assert r.output_ids == [sim_token(r.rid, r.prompt_len, k) for k in range(len(r.output_ids))]
        if 0 <= eos_at < max_new - 1:
            assert r.finish_reason == "eos" and len(r.output_ids) == eos_at + 1
            event("eos")
        else:
            assert r.finish_reason == "length" and len(r.output_ids) == max_new
        assert r.finish_time == r.token_times[-1]
    delivered = sum(len(r.output_ids) for r in reqs)
    assert driver.steps.output_tokens >= delivered
    if driver.steps.output_tokens > delivered:
        event("a token sampled after EOS was dropped")


# ---- 3. the overlap timeline, by hand -------------------------------------------------------------------
CONST = StubCost(host=1.0, host_per_req=0.0, launch=2.0, device=5.0, device_per_token=0.0, device_per_cached=0.0,
                 complete=0.5)


def const_workload(reqs, policy="prefill_first"):
    return Workload(policy=policy, reserve="full", page_size=1, num_pages=256, max_running=8, chunk_size=0,
                    budget=64, prefixes=((1, 2, 3, 4),), reqs=tuple(reqs), cost=CONST)


# One request, prompt 4, 3 outputs, at t=0; each step: host 1, launch 2, device 5, complete 0.5.
# The device starts a step at max(end of the previous step, launch call + host) and ends at
# max(start + device, launch call + host + launch); the loop returns from launch at launch
# call + host + launch, and spends complete after each collect.
#
# overlap=True (step N+1 launched before N is collected):
#   step 0 prefill: scheduled 0, device 1..6, host free at 3; nothing to collect yet
#   step 1 decode:  scheduled 3, device max(6, 4)=6..11, host free at 6; collect 0 at 6 -> token 1 at 6,
#                   complete until 6.5
#   step 2 decode:  scheduled 6.5, device max(11, 7.5)=11..16, host free at 9.5; collect 1 waits for 11
#                   -> token 2 at 11, complete until 11.5
#   at 11.5 nothing is left to schedule (the last token is pending): collect 2 at 16 -> token 3 at 16
# overlap=False (each step collected right after its launch):
#   step 0: scheduled 0, device 1..6, collected at 6 -> token 1 at 6, complete until 6.5
#   step 1: scheduled 6.5, device 7.5..12.5 -> token 2 at 12.5, complete until 13
#   step 2: scheduled 13, device 14..19 -> token 3 at 19
HAND = {
    True: dict(tokens=[6.0, 11.0, 16.0], start=[0.0, 3.0, 6.5], end=[6.0, 11.0, 16.0]),
    False: dict(tokens=[6.0, 12.5, 19.0], start=[0.0, 6.5, 13.0], end=[6.0, 12.5, 19.0]),
}


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_timeline_matches_hand_computation(overlap):
    w = const_workload([(-1, 4, 3, 0.0, -1)])
    driver, sched, (r,), ex = run_sim(w, overlap=overlap)
    want = HAND[overlap]
    assert r.state == RequestState.FINISHED and len(r.output_ids) == 3
    assert r.token_times == pytest.approx(want["tokens"])
    assert r.first_token == pytest.approx(6.0)
    assert r.finish_time == pytest.approx(want["tokens"][-1])
    cols = driver.steps.cols
    assert list(cols["step"]) == [0, 1, 2]
    assert list(cols["prefill_tokens"]) == [4, 0, 0] and list(cols["decode_tokens"]) == [0, 1, 1]
    assert cols["start_s"] == pytest.approx(want["start"])
    assert cols["end_s"] == pytest.approx(want["end"])
    assert cols["duration_s"] == pytest.approx([5.0] * 3)  # the device never waited within a step
    assert cols["predicted_s"] == pytest.approx([5.0] * 3)
    assert cols["host_s"] == pytest.approx([1.0] * 3)
    assert cols["launch_s"] == pytest.approx([2.0] * 3)
    assert cols["complete_s"] == pytest.approx([0.5] * 3)
    assert driver.env.now == pytest.approx(want["tokens"][-1] + 0.5)
    check_no_kv_held(sched)


def test_a_step_after_an_idle_gap_takes_the_wake_factors():
    """Two requests, the second arriving at t=30 when the first has long finished (at 16.5):
    its prefill is launched after 13.5 s of idle host, so its host and launch times take the
    wake factors (x3, x2) and its device time the wake's 1.5 s; every other step is as in the
    hand computation above."""
    import dataclasses
    w = dataclasses.replace(const_workload([(-1, 4, 3, 0.0, -1), (-1, 4, 3, 30.0, -1)]),
                            cost=dataclasses.replace(CONST, wake=(1.0, 3.0, 2.0, 1.5)))
    driver, sched, (a, b), ex = run_sim(w)
    cols = driver.steps.cols
    assert list(cols["prefill_tokens"]) == [4, 0, 0, 4, 0, 0]
    assert cols["host_s"] == pytest.approx([1.0, 1.0, 1.0, 3.0, 1.0, 1.0])
    assert cols["launch_s"] == pytest.approx([2.0, 2.0, 2.0, 4.0, 2.0, 2.0])
    assert cols["duration_s"] == pytest.approx([5.0, 5.0, 5.0, 6.5, 5.0, 5.0])
    assert cols["predicted_s"] == pytest.approx([5.0] * 6)  # the cost model's own time: no wake in it
    assert a.token_times == pytest.approx(HAND[True]["tokens"])
    # b's prefill: scheduled 30, host 3 -> device 33..39.5, enqueued by 37; its decode (host busy
    # until then: not woken) is launched at 37 (device 39.5..44.5) and returns at 40, when the
    # prefill is collected; the second decode, scheduled at 40.5, runs 44.5..49.5
    assert b.token_times == pytest.approx([40.0, 44.5, 49.5])
    check_no_kv_held(sched)


@pytest.mark.parametrize("policy", POLICIES)
def test_overlap_finishes_no_later(policy):
    reqs = [(-1, 4, 3, 0.0, -1), (0, 3, 5, 0.0, -1), (-1, 6, 2, 4.0, -1), (0, 2, 4, 9.0, -1)]
    runs = {}
    for overlap in (True, False):
        driver, sched, rs, ex = run_sim(const_workload(reqs, policy), overlap=overlap)
        assert all(r.state == RequestState.FINISHED and len(r.output_ids) == r.max_new_tokens for r in rs)
        check_no_kv_held(sched)
        runs[overlap] = max(r.finish_time for r in rs)
    assert runs[True] <= runs[False]
    assert runs[True] < runs[False]  # host and device work do overlap here: strictly earlier


# ---- 4. determinism ----------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), decisions=st.one_of(st.none(), abort_decisions))
def test_same_inputs_give_the_same_steps_table(w, decisions):
    a, _, ra, _ = run_sim(w, decisions=decisions)
    b, _, rb, _ = run_sim(w, decisions=decisions)
    assert a.steps.cols == b.steps.cols
    assert a.steps.table().equals(b.steps.table())
    assert [(r.output_ids, r.token_times, r.finish_reason, r.num_preemptions) for r in ra] == \
        [(r.output_ids, r.token_times, r.finish_reason, r.num_preemptions) for r in rb]


# ---- 5. streaming finished requests to the writer --------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), decisions=st.one_of(st.none(), abort_decisions), eos=st.booleans())
def test_streamed_rows_are_the_rows_of_the_finished_ledgers(w, decisions, eos):
    """A run streaming its ended requests' rows writes the table a run that keeps every ledger
    writes, and the steps are the same; the streamed requests keep no per-token lists."""
    kept = run_sim(w, decisions=decisions, eos=eos)
    rows = RequestRows(keep_output_ids=True)
    streamed = run_sim(w, decisions=decisions, eos=eos, rows=rows)
    assert streamed[0].steps.cols == kept[0].steps.cols
    assert len(rows) == sum(r.is_done for r in streamed[2])  # every ended request, once its KV was released
    rest = [r for r in streamed[2] if r.rid not in rows.rids]
    assert requests_table(rest, True, rows=rows).equals(requests_table(kept[2], True))
    for r in streamed[2]:
        if r.rid in rows.rids:
            assert (len(r.token_times), r.output_ids, r.chunk_times, r.prompt_ids) == (0, [], [], None)
