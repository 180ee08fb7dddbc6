"""Scheduling policies on hand-built scenarios: who runs, how many tokens each, when a chunk
happens, queue orders, KV reservation, preemption victims, broken policies and bad knobs."""
from __future__ import annotations

import numpy as np
import pytest

from policies import EVICTIONS, ORDERS, POLICIES, RESERVES, config_like, eviction_key, make_policy, policy_config
from policies.scheduling.prefill_first import PrefillFirst
from scheduler_harness import finish_all, make_scheduler, req, run_all, shared, step
from testbed.core import BatchPlan, RequestState
from testbed.scheduler import PlanError, Scheduler, SchedulerConfig, SchedulerLimits


def items(plan) -> list[tuple[int, int]]:
    return [(r.rid, n) for r, n in zip(plan.reqs, plan.num_tokens)]


def add(s, *reqs, now=0.0):
    for r in reqs:
        s.add_request(r, now)
    return reqs


def assert_all_finished(reqs):
    for r in reqs:
        assert r.state == RequestState.FINISHED, (r.rid, r.state, r.reject_reason)
        assert len(r.output_ids) == r.max_new_tokens and r.finish_reason == "length"


# ---- the registry and knobs -----------------------------------------------------------------
def test_registry_finds_every_policy_and_eviction_by_name():
    assert POLICIES.names() == ["chunked", "decode_first", "prefill_first"]
    assert EVICTIONS.names() == ["fifo", "lfu", "lru", "priority", "slru"]
    for name in POLICIES.names():
        assert make_policy(policy_config(name)).name == name


def test_unknown_names_fail_listing_the_known_ones():
    with pytest.raises(ValueError, match="^policy.name='sarathi' is unknown; allowed: chunked, decode_first, "
                                         "prefill_first$"):
        policy_config("sarathi")
    with pytest.raises(ValueError, match="^eviction.name='arc' is unknown; allowed: fifo, lfu, lru, priority, slru$"):
        eviction_key("arc")
    with pytest.raises(ValueError, match="allowed: fcfs, sjf, lpm, priority"):
        make_policy(policy_config("chunked", order="random"))
    with pytest.raises(ValueError, match="allowed: full, estimate"):
        make_policy(policy_config("chunked", reserve="none"))
    with pytest.raises(ValueError, match="^cache.name='lru' is unknown; allowed: none, radix$"):
        make_scheduler(cache="lru")


@pytest.mark.parametrize("name,key,value,allowed", [
    ("prefill_first", "max_prefill_tokens", 0, "an integer >= 1"),
    ("decode_first", "max_prefill_tokens", 0, "an integer >= 1"),
    ("chunked", "token_budget", -5, "an integer >= 1"),
    ("chunked", "chunk_size", -1, "0 (off) or an integer >= 1"),
    ("decode_first", "estimate_decay", 1.5, "a number in [0, 1]"),
    ("prefill_first", "estimate_min", 0.9, "0 <= min <= init <= 1"),
])
def test_bad_knob_values_name_key_value_and_what_is_allowed(name, key, value, allowed):
    with pytest.raises(ValueError) as e:
        make_policy(policy_config(name, **{key: value}))
    msg = str(e.value)
    assert "policy." in msg and repr(value) in msg and allowed in msg


def test_each_policy_has_its_own_knobs_and_no_limits():
    """The step budget is a knob of the policy it matters to; the limits are no policy's."""
    assert policy_config("chunked").token_budget == 512
    assert policy_config("prefill_first").max_prefill_tokens == policy_config("decode_first").max_prefill_tokens == 8192
    for name in POLICIES.names():
        assert policy_config(name).name == name
        for limit in ("max_running", "max_step_tokens"):
            assert not hasattr(policy_config(name), limit)
    with pytest.raises(ValueError, match="^policy=prefill_first has no knob token_budget; its knobs: order, "):
        policy_config("prefill_first", token_budget=64)
    with pytest.raises(TypeError, match="policy chunked takes a ChunkedConfig, got a PrefillFirstConfig"):
        POLICIES.get("chunked").obj(policy_config("prefill_first"))


def test_a_config_like_another_keeps_the_common_knobs_and_its_own_defaults():
    cfg = policy_config("chunked", token_budget=64, order="sjf", chunk_size=32)
    other = config_like(cfg, "prefill_first")
    assert (other.name, other.order, other.chunk_size, other.max_prefill_tokens) == ("prefill_first", "sjf", 32, 8192)
    assert config_like(cfg, "chunked") is cfg


@pytest.mark.parametrize("key", ["num_pages", "page_size", "max_context"])
def test_bad_scheduler_config_values(key):
    with pytest.raises(ValueError, match=f"{key}=0 is invalid; allowed: an integer >= 1"):
        Scheduler(SchedulerConfig(**{key: 0}), make_policy(policy_config("chunked")), eviction_key("lru"))


@pytest.mark.parametrize("limits,match", [
    (dict(max_running=0), "^scheduler.max_running=0 is invalid; allowed: an integer >= 1$"),
    (dict(max_step_tokens=-1), "^scheduler.max_step_tokens=-1 is invalid; allowed: an integer >= 1$"),
    (dict(max_running=64, max_step_tokens=32), "^scheduler.max_step_tokens=32 is invalid; allowed: at least "
                                               "scheduler.max_running=64"),
])
def test_bad_limits_name_the_scheduler_key(limits, match):
    with pytest.raises(ValueError, match=match):
        Scheduler(SchedulerConfig(limits=SchedulerLimits(**limits)), make_policy(policy_config("chunked")),
                  eviction_key("lru"))


def test_a_step_budget_over_the_step_limit_is_refused_naming_both_keys():
    with pytest.raises(ValueError, match=r"^policy.token_budget=4096 is more than a step may hold "
                                         r"\(scheduler.max_step_tokens=1024\); raise scheduler.max_step_tokens$"):
        make_scheduler("chunked", token_budget=4096, max_step_tokens=1024)
    make_scheduler("chunked", token_budget=1024, max_step_tokens=1024)  # equal fits


def test_the_view_hands_policies_the_limits():
    s = make_scheduler("chunked", max_running=5, max_step_tokens=700)
    v = s.view(0.0)
    assert (v.max_running, v.max_step_tokens) == (5, 700)


# ---- prefill_first ----------------------------------------------------------------------------
def test_prefill_first_admits_in_order_chunks_the_last_and_never_mixes():
    s = make_scheduler("prefill_first", max_prefill_tokens=400)
    add(s, req(0, 100, 3), req(1, 200, 3), req(2, 300, 3), req(3, 50, 3))
    plan, _ = step(s)
    assert items(plan) == [(0, 100), (1, 200), (2, 100)]  # r2 chunked: 100 of 300; r3 waits
    assert plan.samples.tolist() == [True, True, False]
    plan, _ = step(s)
    # the chunked prompt goes on first (200 left), then r3 fits the remaining budget;
    # r0 and r1 are ready to decode but prefill and decode never mix
    assert items(plan) == [(2, 200), (3, 50)]
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 1), (3, 1)]  # one decode batch of everyone
    assert plan.num_decode() == 4
    assert s.waiting == []


def test_prefill_first_chunk_size_cuts_and_only_the_last_admitted_is_cut():
    s = make_scheduler("prefill_first", max_prefill_tokens=1000, chunk_size=64)
    add(s, req(0, 100, 2), req(1, 10, 2))
    plan, _ = step(s)
    assert items(plan) == [(0, 64)]  # cut by chunk_size: nothing is admitted after a cut
    plan, _ = step(s)
    assert items(plan) == [(0, 36), (1, 10)]
    r0 = s.running[0]
    assert [n for _, n in r0.chunk_times] == [64, 36]


def test_prefill_first_every_plan_is_all_prefill_or_all_decode():
    s = make_scheduler("prefill_first", max_prefill_tokens=64, chunk_size=40)
    reqs = [req(i, 20 + 13 * i, 4 + i % 3) for i in range(8)]
    add(s, *reqs)
    while s.has_work():
        plan, _ = step(s)
        # an item decodes when the token it feeds is an output (no preemption here)
        decode = {bool(c >= r.prompt_len) for r, c in zip(plan.reqs, plan.cached_lens)}
        assert len(decode) == 1, items(plan)
        if decode == {False}:
            assert plan.total_tokens <= 64
    assert_all_finished(reqs)


def test_max_running_caps_admission():
    s = make_scheduler("prefill_first", max_running=2)
    reqs = add(s, req(0, 10, 3), req(1, 10, 3), req(2, 10, 3))
    plan, _ = step(s)
    assert items(plan) == [(0, 10), (1, 10)]
    step(s), step(s)  # two decodes: r0 and r1 finish (3 tokens)
    assert reqs[0].is_done and reqs[1].is_done and reqs[2].state == RequestState.WAITING
    plan, _ = step(s)
    assert items(plan) == [(2, 10)]


@pytest.mark.parametrize("name", ["decode_first", "chunked"])
def test_max_running_caps_mixed_policies_too(name):
    s = make_scheduler(name, max_running=3)
    add(s, *[req(i, 5, 50) for i in range(6)])
    for _ in range(5):
        step(s)
        assert len(s.running) <= 3


# ---- decode_first -----------------------------------------------------------------------------
def test_decode_first_mixes_decodes_then_prefill_in_one_budget():
    s = make_scheduler("decode_first", max_prefill_tokens=50)
    add(s, req(0, 10, 10), req(1, 10, 10))
    plan, _ = step(s)
    assert items(plan) == [(0, 10), (1, 10)]
    add(s, req(2, 100, 2))
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 48)]  # decodes first, 48 of the budget for r2
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 48)]  # the prefill under way goes on
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 4)]


def test_decode_first_decodes_beyond_the_budget_wait():
    s = make_scheduler("decode_first", max_prefill_tokens=100)
    reqs = add(s, req(0, 2, 5), req(1, 2, 5), req(2, 2, 5))
    assert items(step(s)[0]) == [(0, 2), (1, 2), (2, 2)]
    s.policy.cfg.max_prefill_tokens = 2  # a step budget smaller than the running decodes
    assert items(step(s)[0]) == [(0, 1), (1, 1)]
    assert items(step(s)[0]) == [(0, 1), (1, 1)]  # r2 waits while the budget is spent
    finish_all(s)
    assert_all_finished(reqs)
    assert reqs[2].finish_time > reqs[1].finish_time


def test_decode_first_chunk_size_caps_each_prefill_but_keeps_admitting():
    s = make_scheduler("decode_first", max_prefill_tokens=100, chunk_size=30)
    add(s, req(0, 50, 2), req(1, 20, 2), req(2, 80, 2))
    plan, _ = step(s)
    assert items(plan) == [(0, 30), (1, 20), (2, 30)]
    plan, _ = step(s)
    # r1 decodes; r0 and r2 go on in chunks of at most 30
    assert items(plan) == [(1, 1), (0, 20), (2, 30)]


# ---- chunked ------------------------------------------------------------------------------------
def test_chunked_token_budget_decodes_first_then_chunks():
    s = make_scheduler("chunked", token_budget=16)
    add(s, req(0, 4, 20), req(1, 4, 20), req(2, 4, 20))
    assert items(step(s)[0]) == [(0, 4), (1, 4), (2, 4)]
    add(s, req(3, 30, 2), req(4, 8, 2))
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 1), (3, 13)]  # 3 decodes + 13 = 16
    assert plan.total_tokens == 16
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 1), (3, 13)]  # the ongoing chunk before new r4
    plan, _ = step(s)
    assert items(plan) == [(0, 1), (1, 1), (2, 1), (3, 4), (4, 8)]
    assert [n for _, n in s.running[3].chunk_times] == [13, 13, 4]


def test_chunked_chunk_size_caps_under_the_budget():
    s = make_scheduler("chunked", token_budget=100, chunk_size=8)
    add(s, req(0, 20, 2), req(1, 20, 2))
    assert items(step(s)[0]) == [(0, 8), (1, 8)]
    assert items(step(s)[0]) == [(0, 8), (1, 8)]
    assert items(step(s)[0]) == [(0, 4), (1, 4)]


def test_chunked_budget_bounds_every_step():
    s = make_scheduler("chunked", token_budget=32, chunk_size=20)
    reqs = add(s, *[req(i, 7 + 11 * i, 5) for i in range(10)])
    while s.has_work():
        plan, _ = step(s)
        assert plan.total_tokens <= 32
        assert all(n <= 20 for n in plan.num_tokens)
    assert_all_finished(reqs)


# ---- queue orders -----------------------------------------------------------------------------------
def _first_admissions(order, make_reqs, warm=None, **kw):
    """Rids in the order the first prefill_first step admits them (fresh requests each call)."""
    s = make_scheduler("prefill_first", order=order, **kw)
    if warm:
        run_all(s, warm())
    reqs = make_reqs()
    add(s, *reqs)
    plan, _ = step(s, 1.0)
    return [rid for rid, _ in items(plan)], reqs


def test_fcfs_is_arrival_order_then_id():
    def make():
        return [req(0, 10, 2, arrival=0.3), req(1, 5, 2, arrival=0.1), req(2, 30, 2, arrival=0.2),
                req(3, 8, 2, arrival=0.1)]
    assert _first_admissions("fcfs", make)[0] == [1, 3, 2, 0]


def test_sjf_is_shortest_prompt_first():
    def make():
        return [req(0, 10, 2, arrival=0.0), req(1, 5, 2, arrival=0.1), req(2, 30, 2, arrival=0.2),
                req(3, 5, 2, arrival=0.05)]
    assert _first_admissions("sjf", make)[0] == [3, 1, 0, 2]


def test_priority_is_priority_then_arrival():
    def make():
        return [req(0, 10, 2, arrival=0.0, priority=0), req(1, 10, 2, arrival=0.1, priority=2),
                req(2, 10, 2, arrival=0.2, priority=5), req(3, 10, 2, arrival=0.05, priority=2)]
    assert _first_admissions("priority", make)[0] == [2, 3, 1, 0]


X40 = np.arange(40, dtype=np.int32) + 7000


def _lpm_warm():
    return [req(90, 0, 1, ids=shared(X40, 90, 5))]


def _lpm_reqs():
    return [req(0, 0, 2, arrival=0.0, ids=shared(X40[:3], 0, 20)),  # shares 3 tokens
            req(1, 0, 2, arrival=0.1, ids=shared(X40[:30], 1, 5)),  # shares 30
            req(2, 0, 2, arrival=0.2, ids=shared(X40[:12], 2, 9)),  # shares 12
            req(3, 0, 2, arrival=0.3, ids=np.arange(25, dtype=np.int32) + 500)]  # shares nothing


def test_lpm_is_longest_cached_prefix_first():
    order, reqs = _first_admissions("lpm", _lpm_reqs, _lpm_warm)
    assert order == [1, 2, 0, 3]
    assert [r.prefix_hit_tokens for r in reqs] == [3, 30, 12, 0]
    assert _first_admissions("fcfs", _lpm_reqs, _lpm_warm)[0] == [0, 1, 2, 3]
    # without a cache there is nothing to match: lpm falls back to arrival order
    order, reqs = _first_admissions("lpm", _lpm_reqs, _lpm_warm, cache="none")
    assert order == [0, 1, 2, 3] and [r.prefix_hit_tokens for r in reqs] == [0, 0, 0, 0]


@pytest.mark.parametrize("P", [4, 16])
def test_lpm_with_pages_counts_whole_pages_only(P):
    order, reqs = _first_admissions("lpm", _lpm_reqs, _lpm_warm, page_size=P)
    hits = [r.prefix_hit_tokens for r in reqs]
    assert hits == [h // P * P for h in [3, 30, 12, 0]]
    assert order == sorted(range(4), key=lambda i: (-hits[i], i))


def test_order_decides_who_gets_a_scarce_slot():
    # one slot: the order alone decides who runs first; the others follow in that order
    for order, expected in [("fcfs", [0, 1, 2]), ("sjf", [2, 1, 0]), ("priority", [1, 2, 0])]:
        s = make_scheduler("chunked", order=order, max_running=1)
        reqs = add(s, req(0, 30, 2, arrival=0.0), req(1, 20, 2, arrival=0.1, priority=3),
                   req(2, 10, 2, arrival=0.2, priority=1))
        finish_all(s)
        firsts = sorted(reqs, key=lambda r: r.first_scheduled)
        assert [r.rid for r in firsts] == expected, order


# ---- reservation -------------------------------------------------------------------------------------
def test_reserve_full_admits_only_what_can_finish():
    # 64 pages; each request needs 10 + 30 - 1 = 39 pages over its life: one at a time
    s = make_scheduler("chunked", num_pages=64, reserve="full")
    reqs = add(s, req(0, 10, 30), req(1, 10, 30))
    plan, _ = step(s)
    assert items(plan) == [(0, 10)]
    finish_all(s)
    assert_all_finished(reqs)
    assert s.num_preemptions == 0
    assert reqs[1].first_scheduled >= reqs[0].finish_time - 0.011


def test_reserve_estimate_admits_more_and_preempts_when_kv_runs_out():
    s = make_scheduler("chunked", num_pages=64, reserve="estimate")
    reqs = add(s, req(0, 10, 30), req(1, 10, 30))
    plan, _ = step(s)
    assert items(plan) == [(0, 10), (1, 10)]  # 10 + 0.7 * 29 = 30 pages each: both fit
    finish_all(s)
    assert_all_finished(reqs)
    assert s.num_preemptions >= 1
    victim = reqs[1]  # the latest admitted goes first
    assert victim.num_preemptions >= 1 and reqs[0].num_preemptions == 0
    assert victim.recomputed_tokens > 0


@pytest.mark.parametrize("name", ["prefill_first", "decode_first", "chunked"])
def test_reserve_full_never_preempts_with_a_shared_prefix_in_the_cache(name):
    """The matched prefix of an admission is locked, so it stops being evictable: admission
    must not count those pages twice (once as evictable KV, once as already held)."""
    X = np.arange(10, dtype=np.int32) + 500
    s = make_scheduler(name, num_pages=20, reserve="full")
    run_all(s, [req(99, 0, 1, ids=shared(X, 99, 1))])  # leaves 11 evictable pages, 9 free
    assert (s.cache.evictable_pages, s.allocator.free_pages) == (11, 9)
    reqs = add(s, req(1, 0, 5, ids=shared(X, 1, 1)), req(2, 5, 6))
    finish_all(s)
    assert_all_finished(reqs)
    assert s.num_preemptions == 0


@pytest.mark.parametrize("reserve", RESERVES)
def test_reservation_rounds_each_running_request_to_its_own_pages(reserve):
    # three requests of 16 prompt tokens on 16-token pages: each one's next decode needs a
    # page of its own, so at least 3 pages are reserved, not pages_for(3 tokens) = 1
    s = make_scheduler("chunked", page_size=16, num_pages=64, reserve=reserve, estimate_init=0.1,
                       estimate_min=0.1)
    add(s, req(0, 16, 3), req(1, 16, 3), req(2, 16, 3))
    step(s)
    v = s.view(0.0)
    assert [(r.device_len, v.pages_held(r)) for r in v.running] == [(17, 1)] * 3
    assert s.policy.reserve.running_pages(v) >= 3


def test_estimate_ratio_decays_and_resets_after_a_preemption():
    pol = make_policy(policy_config("chunked", reserve="estimate", estimate_init=0.5, estimate_min=0.2,
                                    estimate_decay=0.1))
    s = Scheduler(SchedulerConfig(num_pages=64), pol, eviction_key("lru"))
    ratios = []
    for _ in range(5):
        s.schedule(0.0)
        ratios.append(round(pol.reserve.ratio, 6))
    assert ratios == [0.4, 0.3, 0.2, 0.2, 0.2]
    s.num_preemptions += 1  # as if one happened
    s.schedule(0.0)
    assert pol.reserve.ratio == 0.5


# ---- preemption victims --------------------------------------------------------------------------------
class EarliestVictim(PrefillFirst):
    """prefill_first, but preempting the earliest admitted instead of the latest."""
    name = "earliest_victim"

    def choose_victim(self, view, candidates):
        return min(candidates, key=view.admission_order)


def tight_policy(cls=None):
    cfg = policy_config("prefill_first", reserve="estimate", estimate_init=0.2, estimate_min=0.1)
    return cls(cfg) if cls else make_policy(cfg)


def _tight_run(policy):
    s = Scheduler(SchedulerConfig(num_pages=48, check_every_step=True), policy, eviction_key("lru"))
    reqs = add(s, req(0, 8, 30), req(1, 8, 30), req(2, 8, 30))
    finish_all(s)
    assert_all_finished(reqs)
    return s, reqs


def test_default_victim_is_the_latest_admitted():
    s, reqs = _tight_run(tight_policy())
    assert s.num_preemptions >= 1
    assert reqs[0].num_preemptions == 0
    first = min((t, r.rid) for r in reqs for t in r.preempt_times)
    assert first[1] == 2


def test_custom_choose_victim_is_obeyed():
    s, reqs = _tight_run(tight_policy(EarliestVictim))
    assert s.num_preemptions >= 1
    first = min((t, r.rid) for r in reqs for t in r.preempt_times)
    assert first[1] == 0


def test_preempted_requests_recompute_and_produce_the_same_tokens():
    # the synthetic tokens depend only on (rid, position): a preempted run must give the
    # same outputs as an unconstrained one
    big = make_scheduler("prefill_first", num_pages=4096)
    ref = add(big, req(0, 8, 30), req(1, 8, 30), req(2, 8, 30))
    finish_all(big)
    s, reqs = _tight_run(tight_policy())
    assert any(r.num_preemptions for r in reqs)
    for a, b in zip(ref, reqs):
        assert a.output_ids == b.output_ids
        assert len(b.token_times) == b.max_new_tokens
    for r in reqs:
        if r.num_preemptions:
            assert len(r.preempt_times) == r.num_preemptions
            assert r.recomputed_tokens > 0


class ExplicitPreempt(PrefillFirst):
    """Preempts running request 0 at step 2 through plan.preempt."""
    name = "explicit_preempt"

    def plan(self, view):
        if view.step_id == 2:
            plan = BatchPlan()
            plan.preempt = [r for r in view.running if r.rid == 0]
            for r in view.running:
                if r.rid != 0:
                    plan.add(r, 1)
            return plan
        return super().plan(view)


def test_policy_can_preempt_through_the_plan():
    pol = ExplicitPreempt(ExplicitPreempt.Config())
    s = Scheduler(SchedulerConfig(num_pages=256, check_every_step=True), pol, eviction_key("lru"))
    reqs = add(s, req(0, 6, 5), req(1, 6, 5))
    for _ in range(3):
        plan, _ = step(s)
    assert reqs[0].state == RequestState.PREEMPTED and reqs[0].num_preemptions == 1
    assert s.stats_of(plan).preempted == 1
    finish_all(s)
    assert_all_finished(reqs)


# ---- broken policies -------------------------------------------------------------------------------------
class Broken(PrefillFirst):
    name = "broken"

    def __init__(self, cfg, bad):
        super().__init__(cfg)
        self.bad = bad

    def plan(self, view):
        plan = super().plan(view)
        if view.step_id >= 1:
            self.bad(view, plan)
        return plan


def _twice(view, plan):
    plan.add(plan.reqs[0], 1)


def _too_many(view, plan):
    plan.num_tokens[0] = 5


def _zero(view, plan):
    plan.num_tokens[0] = 0


def _ragged(view, plan):
    plan.num_tokens.append(1)


def _preempt_waiting(view, plan):
    plan.preempt = [view.waiting[0]]


def _run_and_preempt(view, plan):
    plan.preempt = [plan.reqs[0]]


def _too_long_prompt(view, plan):
    plan.reqs.clear(), plan.num_tokens.clear()
    plan.add(view.waiting[0], view.waiting[0].device_len + 1)


@pytest.mark.parametrize("bad,match", [
    (_twice, "appears twice"),
    (_too_many, "5 tokens asked, 1 can run"),
    (_zero, "0 tokens asked"),
    (_ragged, "differ in length"),
    (_preempt_waiting, "cannot be preempted"),
    (_run_and_preempt, "both run and preempted"),
    (_too_long_prompt, "prompt has"),
])
def test_a_bad_plan_raises_plan_error(bad, match):
    s = Scheduler(SchedulerConfig(num_pages=256, limits=SchedulerLimits(max_running=2)), Broken(Broken.Config(), bad),
                  eviction_key("lru"))
    add(s, req(0, 4, 5), req(1, 4, 5), req(2, 4, 5))
    step(s)
    with pytest.raises(PlanError, match=match):
        s.schedule(0.0)


def test_a_plan_over_the_step_limit_raises_plan_error():
    """A policy that plans more tokens than view.max_step_tokens is refused before any of it is applied."""
    def _and_a_decode(view, plan):
        plan.add(view.running[0], 1)

    limits = SchedulerLimits(max_running=2, max_step_tokens=4)
    s = Scheduler(SchedulerConfig(num_pages=256, limits=limits),
                  Broken(Broken.Config(max_prefill_tokens=4), _and_a_decode), eviction_key("lru"))
    add(s, req(0, 4, 5), req(1, 4, 5))
    plan, _ = step(s)
    assert items(plan) == [(0, 4)]  # 4 tokens: a full step
    before = [(r.rid, r.device_len, r.cached_len) for r in s.running]
    with pytest.raises(PlanError, match=r"^the plan holds 5 tokens, more than a step may hold "
                                        r"\(scheduler.max_step_tokens=4\)$"):
        s.schedule(0.0)
    assert [r.rid for r in s.waiting] == [1] and [(r.rid, r.device_len, r.cached_len) for r in s.running] == before


def test_a_plan_naming_a_finished_request_raises_plan_error():
    done = req(9, 4, 1)

    def _finished(view, plan):
        plan.add(done, 1)

    s = Scheduler(SchedulerConfig(num_pages=256), Broken(Broken.Config(), _finished), eviction_key("lru"))
    run_all(s, [done])
    add(s, req(0, 4, 5))
    with pytest.raises(PlanError, match="neither waiting nor schedulable"):
        s.schedule(0.0)


class BadVictim(PrefillFirst):
    name = "bad_victim"

    def choose_victim(self, view, candidates):
        return view.waiting[0] if view.waiting else candidates[0]


def test_a_victim_that_is_not_a_candidate_raises_plan_error():
    pol = tight_policy(BadVictim)
    s = Scheduler(SchedulerConfig(num_pages=48), pol, eviction_key("lru"))
    add(s, *[req(i, 8, 30) for i in range(4)])
    with pytest.raises(PlanError, match="victim"):
        for _ in range(200):
            step(s)


# ---- determinism ----------------------------------------------------------------------------------------
def _workload():
    X = np.arange(24, dtype=np.int32) + 3000
    out = []
    for i in range(24):
        ids = shared(X[: (i * 5) % 24], i, 3 + (i * 7) % 17)
        out.append(req(i, 0, 2 + (i * 3) % 9, arrival=0.0, ids=ids, priority=i % 3))
    return out


@pytest.mark.parametrize("name", ["prefill_first", "decode_first", "chunked"])
@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("reserve", list(RESERVES))
def test_same_inputs_same_plans(name, order, reserve):
    kw = dict(num_pages=160, order=order, reserve=reserve, budget=24 if name == "chunked" else 48, chunk_size=16)
    a = run_all(make_scheduler(name, **kw), _workload())
    b = run_all(make_scheduler(name, **kw), _workload())
    assert a == b and len(a) > 5
