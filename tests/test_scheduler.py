"""The scheduler's mechanics on hand-built scenarios: rejection, abort (waiting, running, in
flight), EOS, the prefix caches and page sizes, eviction under pressure, overlap-style
driving, ledger times, and the integrity check itself."""
from __future__ import annotations

import numpy as np
import pytest

from policies import eviction_key
from policies.scheduling.prefill_first import PrefillFirst
from scheduler_harness import finish_all, make_scheduler, req, run_all, shared, step, synthetic_tokens
from testbed.core import RequestState, StepResult
from testbed.scheduler import Scheduler
from testbed.kv import IntegrityError

POLICIES = ["prefill_first", "decode_first", "chunked"]


def items(plan):
    return [(r.rid, n) for r, n in zip(plan.reqs, plan.num_tokens)]


def no_leak(s):
    """Everything free or cached; all cached pages evictable; nothing held by anyone."""
    counts = s.check_integrity()
    assert counts["in_use"] == 0
    assert counts["free"] + counts["cached"] == counts["total"]
    assert s.cache.evictable_pages == s.cache.cached_pages
    assert s.page_table.num_free_rows == s.cfg.limits.max_running
    assert not s.running and not s.waiting and not s.live_requests()


def expected_tokens(r):
    """What synthetic_tokens gives request r: rid * 7 + (position + 1) of each output."""
    return [r.rid * 7 + r.prompt_len + 1 + i for i in range(r.max_new_tokens)]


# ---- rejection -------------------------------------------------------------------------------
def test_over_context_is_rejected_with_the_reason_and_nothing_hangs():
    s = make_scheduler("chunked", max_context=50)
    bad, ok = req(0, 40, 20), req(1, 40, 10)
    run_all(s, [bad, ok])
    assert bad.state == RequestState.REJECTED and bad.finish_reason == "rejected"
    assert "prompt 40 + max_new_tokens 20 tokens exceeds the model context 50" in bad.reject_reason
    assert bad.finish_time == 0.0 and bad.row == -1 and not bad.output_ids
    assert ok.state == RequestState.FINISHED and len(ok.output_ids) == 10
    assert s.done[0] is bad
    no_leak(s)


@pytest.mark.parametrize("P,num_pages,prompt,out,need", [(1, 16, 10, 10, 19), (4, 4, 10, 10, 5), (16, 2, 30, 8, 3)])
def test_more_pages_than_the_pool_is_rejected(P, num_pages, prompt, out, need):
    s = make_scheduler("prefill_first", num_pages=num_pages, page_size=P)
    r = req(0, prompt, out)
    s.add_request(r, 0.5)
    assert r.state == RequestState.REJECTED and r.finish_time == 0.5
    assert r.reject_reason == f"needs {need} KV pages, the pool has {num_pages}"
    assert not s.has_work()
    assert s.schedule(1.0) is None


@pytest.mark.parametrize("P", [1, 4])
def test_a_request_that_exactly_fits_the_pool_runs(P):
    # prompt + output - 1 tokens of KV (the last output is never fed back) fill the pool
    s = make_scheduler("chunked", num_pages=19 // P + (19 % P > 0), page_size=P)
    rs = [req(0, 10, 10), req(1, 10, 10)]
    run_all(s, rs)
    assert all(r.state == RequestState.FINISHED and len(r.output_ids) == 10 for r in rs)
    no_leak(s)


# ---- abort ---------------------------------------------------------------------------------------
def test_abort_waiting_request():
    s = make_scheduler("prefill_first", max_running=1)
    a, b = req(0, 8, 4), req(1, 8, 4)
    s.add_request(a, 0.0), s.add_request(b, 0.0)
    step(s)
    s.abort(b, 0.02)
    assert b.state == RequestState.ABORTED and b.finish_reason == "abort" and b.finish_time == 0.02
    assert b not in s.waiting and b.row == -1 and b.cached_len == 0
    finish_all(s)
    assert a.state == RequestState.FINISHED
    no_leak(s)


@pytest.mark.parametrize("name", POLICIES)
def test_abort_running_request_between_steps_releases_its_kv(name):
    s = make_scheduler(name)
    a, b = req(0, 8, 10), req(1, 8, 10)
    s.add_request(a, 0.0), s.add_request(b, 0.0)
    step(s), step(s), step(s)
    assert a.state == RequestState.RUNNING
    s.abort(a, 0.1)
    assert a.state == RequestState.ABORTED and a.row == -1
    assert a not in s.running
    s.check_integrity()
    # its computed prefix went to the cache, unreferenced
    assert s.cache.peek(a.token_ids(a.cached_len)) == a.cached_len
    finish_all(s)
    assert b.state == RequestState.FINISHED and len(b.output_ids) == 10
    assert 1 <= len(a.output_ids) < 10
    no_leak(s)


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_abort_in_flight_keeps_kv_until_complete_and_never_double_frees(name, when):
    s = make_scheduler(name)
    a, b = req(0, 12, 10), req(1, 12, 10)
    s.add_request(a, 0.0), s.add_request(b, 0.0)
    if when == "decode":
        step(s)
    plan = s.schedule(0.1)
    assert a in plan.reqs
    toks = synthetic_tokens(plan)
    free, cached = s.allocator.free_pages, s.cache.cached_pages
    held_pages = a.num_pages
    s.abort(a, 0.105)
    assert a.state == RequestState.ABORTED and a.is_done
    # the step that uses a's KV is still running: nothing of a's is released yet
    assert a.row >= 0 and a.num_pages == held_pages
    assert (s.allocator.free_pages, s.cache.cached_pages) == (free, cached)
    s.check_integrity()
    assert a not in s.running and a not in s.view(0.105).running
    s.abort(a, 0.106)  # a second abort is a no-op
    ended = s.complete(plan, StepResult(0.01, toks), 0.11)
    assert a not in ended  # it ended at the abort, not here
    assert a.row == -1 and a.num_pages == 0
    assert a.pending_tokens == 0 and a.inflight == 0
    assert len(a.output_ids) == (1 if when == "decode" else 0), "the in-flight token is dropped"
    assert a.device_len == a.prompt_len + len(a.output_ids)
    s.check_integrity()
    s.abort(a, 0.2)
    finish_all(s, 0.2)
    assert b.state == RequestState.FINISHED
    no_leak(s)


def test_abort_of_a_request_in_two_overlapping_steps():
    s = make_scheduler("chunked")
    a = req(0, 6, 10)
    s.add_request(a, 0.0)
    p1 = s.schedule(0.0)
    t1 = synthetic_tokens(p1)
    p2 = s.schedule(0.01)  # overlap: a decodes on its pending first token
    t2 = synthetic_tokens(p2)
    assert a.inflight == 2 and a.pending_tokens == 2
    s.abort(a, 0.015)
    s.complete(p1, StepResult(0.01, t1), 0.02)
    assert a.row >= 0, "still used by the second step"
    s.check_integrity()
    s.complete(p2, StepResult(0.01, t2), 0.03)
    assert a.row == -1 and a.output_ids == [] and a.device_len == a.prompt_len
    no_leak(s)


def test_abort_after_finish_is_a_no_op():
    s = make_scheduler("chunked")
    a = req(0, 4, 2)
    run_all(s, [a])
    s.abort(a, 1.0)
    assert a.state == RequestState.FINISHED and a.finish_reason == "length"
    no_leak(s)


def test_abort_preempted_request():
    s = make_scheduler("prefill_first", num_pages=48, reserve="estimate", estimate_init=0.2, estimate_min=0.1)
    rs = [req(i, 8, 30) for i in range(3)]
    for r in rs:
        s.add_request(r, 0.0)
    t = 0.0
    while not any(r.state == RequestState.PREEMPTED for r in rs):
        step(s, t)
        t += 0.01
    victim = next(r for r in rs if r.state == RequestState.PREEMPTED)
    s.abort(victim, t)
    assert victim.state == RequestState.ABORTED and victim not in s.waiting
    finish_all(s, t)
    assert sum(r.state == RequestState.FINISHED for r in rs) == 2
    no_leak(s)


# ---- finishing --------------------------------------------------------------------------------------
def test_eos_finishes_early_unless_ignored():
    s = make_scheduler("chunked")
    # synthetic tokens: rid * 7 + device_len at sampling; for rid 0, prompt 5 -> 6, 7, 8, ...
    stop = req(0, 5, 10, ignore_eos=False, eos_token_ids=(8, 99))
    cont = req(1, 5, 10, ignore_eos=True, eos_token_ids=(7 + 8,))
    run_all(s, [stop, cont])
    assert stop.finish_reason == "eos" and stop.output_ids == [6, 7, 8]
    assert stop.state == RequestState.FINISHED and len(stop.token_times) == 3
    assert cont.finish_reason == "length" and len(cont.output_ids) == 10
    no_leak(s)


def test_eos_on_the_first_token():
    s = make_scheduler("prefill_first")
    r = req(0, 5, 10, ignore_eos=False, eos_token_ids=(6,))
    run_all(s, [r])
    assert r.output_ids == [6] and r.finish_reason == "eos" and r.first_token == r.finish_time
    no_leak(s)


def test_length_finish_and_event_times():
    s = make_scheduler("chunked", token_budget=8)
    r = req(0, 20, 4)
    s.add_request(r, 0.0)
    t = finish_all(s, 1.0)
    assert r.output_ids == expected_tokens(r)
    assert r.first_scheduled == 1.0
    assert [n for _, n in r.chunk_times] == [8, 8, 4]
    assert r.first_token == pytest.approx(1.03) and len(r.token_times) == 4
    assert list(r.token_times) == sorted(r.token_times) and r.finish_time == r.token_times[-1]
    assert r.finish_time == pytest.approx(t)
    assert r.prefix_hit_tokens == 0 and r.num_preemptions == 0


def test_complete_with_the_wrong_number_of_tokens_raises():
    s = make_scheduler("chunked")
    s.add_request(req(0, 4, 3), 0.0)
    s.add_request(req(1, 4, 3), 0.0)
    plan = s.schedule(0.0)
    with pytest.raises(ValueError, match="expected 2 tokens, got 1"):
        s.complete(plan, StepResult(0.01, np.array([1])), 0.01)


def test_step_stats_count_prefill_and_decode():
    s = make_scheduler("chunked", token_budget=10)
    s.add_request(req(0, 4, 5), 0.0)
    step(s)
    s.add_request(req(1, 30, 5), 0.0)
    plan, _ = step(s)
    st = s.stats_of(plan)
    assert (st.decode_reqs, st.decode_tokens, st.prefill_reqs, st.prefill_tokens, st.admitted) == (1, 1, 1, 9, 1)


# ---- prefix caches and pages ---------------------------------------------------------------------------
def test_radix_shares_a_prefix_between_running_requests():
    X = np.arange(32, dtype=np.int32) + 100
    s = make_scheduler("prefill_first")
    a = req(0, 0, 20, ids=shared(X, 0, 4))
    s.add_request(a, 0.0)
    step(s)  # a's prompt is now in the tree, locked by a
    b = req(1, 0, 5, ids=shared(X, 1, 8))
    s.add_request(b, 0.0)
    plan, _ = step(s)
    assert items(plan) == [(1, 8)] and b.prefix_hit_tokens == 32
    # both page-table rows point at the same pages for the shared 32 tokens
    pa = s.page_table.read(a.row, 0, 32)
    assert (pa == s.page_table.read(b.row, 0, 32)).all()
    s.check_integrity()
    finish_all(s)
    no_leak(s)
    assert s.cache.peek(a.token_ids(a.prompt_len + 19)) == a.prompt_len + 19  # whole sequence cached at finish


def test_none_cache_shares_nothing_and_frees_everything():
    X = np.arange(32, dtype=np.int32) + 100
    s = make_scheduler("chunked", cache="none")
    rs = [req(i, 0, 6, ids=shared(X, i, 3)) for i in range(4)]
    run_all(s, rs[:2])
    run_all(s, rs[2:])
    assert [r.prefix_hit_tokens for r in rs] == [0, 0, 0, 0]
    assert s.cache.cached_pages == 0 and s.allocator.free_pages == s.cfg.num_pages
    no_leak(s)
    assert [r.output_ids for r in rs] == [expected_tokens(r) for r in rs]


@pytest.mark.parametrize("P", [4, 16])
def test_page_size_aligned_matching_and_partial_tail_pages_freed(P):
    X = np.arange(40, dtype=np.int32) + 100
    s = make_scheduler("chunked", page_size=P, num_pages=64)
    a = req(0, 0, 4, ids=shared(X, 0, 3))  # 43 prompt tokens
    run_all(s, [a])
    # a's KV: 43 + 3 = 46 tokens (the last output never fed back); whole pages go to the tree,
    # the partial tail page is freed
    kv = a.prompt_len + a.max_new_tokens - 1
    assert s.cache.cached_pages == kv // P
    assert s.allocator.free_pages == 64 - kv // P
    no_leak(s)
    b = req(1, 0, 2, ids=shared(X[:37], 1, 5))  # shares 37 tokens with a
    run_all(s, [b])
    assert b.prefix_hit_tokens == 37 // P * P
    assert all(len(n.key) % P == 0 for n in s.cache.nodes())
    no_leak(s)


@pytest.mark.parametrize("P", [1, 4, 16])
def test_page_size_with_chunks_and_decodes_keeps_ledger_and_pages_consistent(P):
    s = make_scheduler("chunked", page_size=P, num_pages=4096 // P, token_budget=24, chunk_size=10)
    X = np.arange(50, dtype=np.int32)
    rs = [req(i, 0, 3 + i % 5, ids=shared(X[: 7 * i % 50], i, 5 + i)) for i in range(12)]
    for r in rs:
        s.add_request(r, 0.0)
    while s.has_work():
        step(s)
        for r in s.running:
            assert r.num_pages == -(-r.cached_len // P)  # exactly the pages its KV needs
    assert [r.output_ids for r in rs] == [expected_tokens(r) for r in rs]
    no_leak(s)


# ---- eviction under pressure -------------------------------------------------------------------------
@pytest.mark.parametrize("eviction,survivor", [("lru", "B"), ("fifo", "B"), ("lfu", "A"), ("slru", "A"), ("priority", "A")])
def test_eviction_order_decides_which_old_prefix_survives(eviction, survivor):
    """A: created first, priority 2, two prefix hits; B: created later, one hit, used last.
    lru and fifo drop A (older use / older creation); lfu, slru (A is protected after two
    hits) and priority keep A."""
    s = make_scheduler("chunked", num_pages=40, eviction=eviction)
    A = np.arange(15, dtype=np.int32) + 100
    B = np.arange(15, dtype=np.int32) + 300
    run_all(s, [req(0, 0, 1, ids=A, priority=2)])  # A: first, high priority
    run_all(s, [req(1, 0, 1, ids=B)])  # B: later
    for i in range(2):  # A is used twice more (prefix hits), before B's last use
        run_all(s, [req(2 + i, 0, 1, ids=shared(A, 2 + i, 1))])
    run_all(s, [req(5, 0, 1, ids=shared(B, 5, 1))])
    # A (15) with two one-page continuations, B (15) with one
    assert s.cache.cached_pages == 33
    # a newcomer needing 20 pages: 7 free, so 13 must go: all of A's branch or all of B's
    run_all(s, [req(9, 20, 1)])
    a_left, b_left = s.cache.peek(A), s.cache.peek(B)
    assert (a_left, b_left) == ((15, 0) if survivor == "A" else (0, 15))
    no_leak(s)


def test_running_request_prefix_is_never_evicted_under_pressure():
    X = np.arange(20, dtype=np.int32) + 100
    s = make_scheduler("chunked", num_pages=60, token_budget=16)
    a = req(0, 0, 30, ids=shared(X, 0, 2))
    s.add_request(a, 0.0)
    step(s), step(s)
    assert a.shared_len == 22  # two chunks (16 + 6): the whole prompt is shared and locked
    t = 0.1
    for i in range(1, 8):  # strangers churn the rest of the pool through the cache
        s.add_request(req(i, 10, 2), t)
        while any(r.rid == i for r in s.waiting + s.running):
            step(s, t)
            t += 0.01
            s.check_integrity()
            assert s.cache.peek(a.prompt_ids) >= a.shared_len
    assert s.cache.evicted_pages_total > 0
    finish_all(s, t)
    assert a.output_ids == expected_tokens(a)
    no_leak(s)


# ---- overlap-style driving -------------------------------------------------------------------------------
def run_overlap(s, reqs):
    """Schedule step N+1 before completing step N (tokens are fixed when a step is planned)."""
    for r in reqs:
        s.add_request(r, 0.0)
    inflight, t, n = None, 0.0, 0
    while s.has_work() or inflight:
        plan = s.schedule(t)
        nxt = (plan, synthetic_tokens(plan)) if plan is not None else None
        if inflight is not None:
            s.complete(inflight[0], StepResult(0.01, inflight[1]), t + 0.01)
        elif plan is None:
            raise AssertionError("stalled")
        inflight = nxt
        t += 0.01
        n += 1
        assert n < 100_000
        s.check_integrity()


def _overlap_workload():
    X = np.arange(30, dtype=np.int32) + 4000
    rs = []
    for i in range(16):
        ids = shared(X[: (i * 7) % 30], i, 4 + (i * 5) % 23)
        rs.append(req(i, 0, 1 + (i * 3) % 11, ids=ids, ignore_eos=(i % 4 != 0),
                      eos_token_ids=(i * 7 + len(ids) + 3,)))
    return rs


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("P", [1, 4])
def test_overlap_gives_the_same_outputs_as_sync(name, P):
    kw = dict(page_size=P, num_pages=512 // P, budget=20 if name == "chunked" else 40, chunk_size=12)
    sync = _overlap_workload()
    run_all(make_scheduler(name, **kw), sync)
    over = _overlap_workload()
    s = make_scheduler(name, **kw)
    run_overlap(s, over)
    assert [r.output_ids for r in over] == [r.output_ids for r in sync]
    assert [r.finish_reason for r in over] == [r.finish_reason for r in sync]
    assert any(r.finish_reason == "eos" for r in sync)
    no_leak(s)


class RowBlindPrefillFirst(PrefillFirst):
    """prefill_first as a policy that forgets view.free_rows would plan: admissions up to
    max_running - len(view.running)."""

    def admit(self, view, plan, budget, kv_left=None, chunk_last_only=False):
        for r in self.order(view):
            if budget <= 0 or len(view.running) + len(plan) >= view.max_running:
                break
            plan.add(r, r.device_len)
            budget -= r.device_len
        return budget


def test_overlap_admission_without_a_free_row_is_dropped_not_half_applied():
    # a's only token is pending in a step in flight: the view no longer counts it as running,
    # but it still holds its page-table row until that step completes; a policy that admits
    # into that row has the admission dropped, whole
    built = make_scheduler("prefill_first", max_running=2)
    s = Scheduler(built.cfg, RowBlindPrefillFirst(built.policy.cfg), eviction_key("lru"))
    a, b, c = req(0, 4, 1), req(1, 4, 3), req(2, 4, 3)
    s.add_request(a, 0.0)
    p1 = s.schedule(0.0)
    t1 = synthetic_tokens(p1)
    s.add_request(b, 0.0), s.add_request(c, 0.0)
    row_a = s.page_table.read(a.row, 0, 4).copy()
    p2 = s.schedule(0.01)  # plans b and c; one row is free
    assert items(p2) == [(1, 4)] and s.stats_of(p2).deferred == 1
    assert c.state == RequestState.WAITING and c.row == -1 and c.cached_len == 0 and c.inflight == 0
    assert (s.page_table.read(a.row, 0, 4) == row_a).all()
    s.check_integrity()
    t2 = synthetic_tokens(p2)
    s.complete(p1, StepResult(0.01, t1), 0.02)
    s.complete(p2, StepResult(0.01, t2), 0.03)
    finish_all(s, 0.03)
    assert [r.output_ids for r in (a, b, c)] == [expected_tokens(r) for r in (a, b, c)]
    no_leak(s)


@pytest.mark.parametrize("name", POLICIES)
def test_every_row_held_a_step_in_flight_ending_one_the_others_decode(name):
    """Every row held, the step in flight ending a request, someone waiting: the policies admit
    nobody (view.free_rows is 0) and the step decodes the others, as overlap wants, rather
    than planning an admission the scheduler must drop and leaving the device a step idle."""
    s = make_scheduler(name, max_running=2)
    a, b, c = req(0, 4, 2), req(1, 4, 6), req(2, 4, 3)
    s.add_request(a, 0.0), s.add_request(b, 0.0)
    p = s.schedule(0.0)
    toks = synthetic_tokens(p)  # a step's tokens are fixed when it is planned
    while a.device_len < a.max_len:  # until a's last token is the one in flight
        nxt = s.schedule(0.0)
        nxt_toks = synthetic_tokens(nxt)
        s.complete(p, StepResult(0.01, toks), 0.0)
        p, toks = nxt, nxt_toks
    s.add_request(c, 0.0)
    view = s.view(0.0)
    assert list(view.running) == [b] and view.free_rows == 0
    nxt = s.schedule(0.01)
    assert nxt is not None and items(nxt) == [(1, 1)] and s.stats_of(nxt).deferred == 0
    assert c.state == RequestState.WAITING
    nxt_toks = synthetic_tokens(nxt)
    s.complete(p, StepResult(0.01, toks), 0.02)
    assert a.is_done and s.view(0.02).free_rows == 1
    s.complete(nxt, StepResult(0.01, nxt_toks), 0.03)
    finish_all(s, 0.03)
    assert [r.output_ids for r in (a, b, c)] == [expected_tokens(r) for r in (a, b, c)]
    no_leak(s)


def test_overlap_under_kv_pressure_finishes_everything():
    s = make_scheduler("chunked", num_pages=96, reserve="estimate", estimate_init=0.3, estimate_min=0.1,
                       token_budget=32)
    rs = [req(i, 10 + i, 20) for i in range(10)]
    run_overlap(s, rs)
    assert all(r.state == RequestState.FINISHED and r.output_ids == expected_tokens(r) for r in rs)
    no_leak(s)


# ---- the integrity check itself ----------------------------------------------------------------------
def test_integrity_check_catches_a_freed_page_still_in_use():
    s = make_scheduler("chunked", check=False)
    r = req(0, 8, 5)
    s.add_request(r, 0.0)
    step(s), step(s)
    s.check_integrity()
    assert len(s.kv.own_pages(r)) == 1  # the decode's page; the prompt's are in the tree
    s.allocator.free(s.kv.own_pages(r))  # a bug would do this
    with pytest.raises(IntegrityError):
        s.check_integrity()


def test_integrity_check_catches_a_lost_shared_prefix():
    X = np.arange(16, dtype=np.int32)
    s = make_scheduler("prefill_first", check=False)
    r = req(0, 0, 5, ids=shared(X, 0, 1))
    s.add_request(r, 0.0)
    step(s)
    assert r.shared_len == 17
    r.cache_node.lock_ref = 0  # a bug forgets the lock: the prefix becomes evictable ...
    s.cache.evictable_pages += r.cache_node.num_pages
    s.allocator.free(s.cache.evict(100))  # ... and goes while r still reads it
    with pytest.raises(IntegrityError, match="lost shared prefix pages"):
        s.check_integrity()


def test_integrity_check_catches_lengths_out_of_order():
    s = make_scheduler("chunked", check=False)
    r = req(0, 8, 5)
    s.add_request(r, 0.0)
    step(s)
    r.cached_len = r.device_len + 1
    with pytest.raises(AssertionError, match="lengths out of order"):
        s.check_integrity()


def test_own_pages_are_counted_apart_from_the_pool():
    """pages_used (steps.parquet) is the count of pages handed to requests and not given back,
    not the pool's total minus free minus cached: a page lost from a row shows up."""
    s = make_scheduler("chunked", check=False)
    r = req(0, 8, 5)
    s.add_request(r, 0.0)
    step(s), step(s)
    total = s.cfg.num_pages
    assert s.kv.owned_pages == len(s.kv.own_pages(r)) == s.check_integrity()["in_use"] == 1
    assert s.kv.owned_pages + s.cache.cached_pages + s.allocator.free_pages == total
    s.allocator.free(s.kv.own_pages(r))  # a bug frees a page r still holds
    assert s.kv.owned_pages + s.cache.cached_pages + s.allocator.free_pages == total + 1  # the record shows it
    with pytest.raises(IntegrityError):
        s.check_integrity()


def test_steps_record_used_cached_and_free_pages_that_add_up(tmp_path):
    """Each count from its own source; their sum is the pool on every step of a run that evicts
    and preempts."""
    import pandas as pd

    from testbed.config import compose
    from testbed.run import run
    cfg = compose(["trace=sharegpt", "trace.num_requests=200", "trace.rate=200", "policy=chunked",
                   "policy.reserve=estimate", "engine.num_pages=3000", "progress=false"])
    s = run(cfg, str(tmp_path / "run"), print_table=False)
    steps = pd.read_parquet(tmp_path / "run/steps.parquet")
    assert steps["evicted_pages"].sum() > 0 and steps["preempted"].sum() > 0
    total = steps["pages_used"] + steps["pages_cached"] + steps["pages_free"]
    assert (total == s["kv"]["num_pages"]).all()
    assert steps["pages_used"].max() > 0 and steps["pages_cached"].max() > 0


def test_check_every_step_runs_the_check():
    s = make_scheduler("chunked", check=True, cache="none")
    r = req(0, 8, 5)
    s.add_request(r, 0.0)
    step(s)
    s.allocator.free(s.kv.own_pages(r)[:1])
    with pytest.raises(IntegrityError):
        step(s)


def test_one_token_last_chunk_still_shares_the_prompt():
    """A prefill whose last chunk is a single token still puts the prompt in the prefix cache
    when it completes, not only when the request finishes."""
    s = make_scheduler("chunked", num_pages=4096, token_budget=7)
    a = req(0, 15, 50)  # 15 = 7 + 7 + 1: the last chunk is one token
    s.add_request(a, 0.0)
    for _ in range(3):
        step(s, 0.0)
    assert a.output_ids and a.cached_len == 15 and a.state.name == "RUNNING"
    assert s.cache.peek(a.prompt_ids) == 15  # shared while a is still running
    assert a.shared_len == 15


def test_token_slice_equals_token_ids_slices():
    import numpy as np

    from testbed.core import Request
    r = Request(rid=0, arrival=0.0, prompt_len=5, max_new_tokens=8, prompt_ids=np.arange(10, 15, dtype=np.int32))
    r.output_ids.extend([90, 91, 92])
    for start in range(8):
        for end in range(start, 9):
            assert np.array_equal(r.token_slice(start, end), r.token_ids(end)[start:]), (start, end)
