"""The read-only views policies get: the scheduler's view (testbed.core.SchedulerView) cannot
change the queues, holds exactly the protocol's members and its accessors tell the ledger's
figures; an eviction order's key reads nothing of a radix node but NodeView's members."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import EVICTIONS, PolicyConfig, eviction_key, policy_config
from policies.scheduling.chunked import Chunked
from scheduler_harness import make_scheduler, req, run_all, step, try_to_mutate
from testbed.core import NodeView, SchedulerView
from testbed.kv import RadixCache
from testbed.scheduler import Scheduler, SchedulerConfig, SchedulerLimits


def queues(s) -> tuple[list, list]:
    return list(s.waiting), list(s.running)


def busy_scheduler(**kw):
    s = make_scheduler("chunked", num_pages=4096, max_running=3, **kw)
    for i in range(6):
        s.add_request(req(i, 8 + i, 4, arrival=0.01 * i), 0.0)
    step(s)
    return s


def test_the_queues_cannot_be_changed_through_the_view():
    s = busy_scheduler()
    view = s.view(0.0)
    assert len(view.waiting) and len(view.running)
    before = queues(s)
    assert try_to_mutate(view) == []
    assert queues(s) == before


def test_the_view_shows_the_queues_as_they_are_without_copying_them():
    s = busy_scheduler()
    view = s.view(0.0)
    assert list(view.waiting) == s.waiting and list(view.running) == s.running
    assert view.waiting[0] is s.waiting[0] and view.running[-1] is s.running[-1]
    assert all(r in view.running for r in s.running) and s.waiting[0] not in view.running
    assert view.waiting.index(s.waiting[1]) == 1 and view.running.count(s.running[0]) == 1
    assert list(reversed(view.waiting)) == s.waiting[::-1]
    # a slice is a copy: a tuple, not a way back to the list
    part = view.waiting[:2]
    assert isinstance(part, tuple) and list(part) == s.waiting[:2]


class Meddler(Chunked):
    """chunked, but first tries every mutation of the queues it can think of."""
    name = "meddler"

    def __init__(self, cfg: PolicyConfig):
        super().__init__(cfg)
        self.worked: list[str] = []

    def plan(self, view: SchedulerView):
        self.worked += try_to_mutate(view)
        return super().plan(view)


def test_a_meddling_policy_changes_nothing():
    reqs = lambda: [req(i, 10 + 3 * i, 5, arrival=0.0) for i in range(8)]  # noqa: E731
    plain = run_all(make_scheduler("chunked", max_running=3, token_budget=16), reqs())
    pol = Meddler(policy_config("chunked", token_budget=16))
    s = Scheduler(SchedulerConfig(num_pages=4096, max_context=100_000, check_every_step=True,
                                  limits=SchedulerLimits(max_running=3)), pol, eviction_key("lru"))
    assert run_all(s, reqs()) == plain
    assert pol.worked == []


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["arrive", "step", "view"]), st.integers(1, 20)), max_size=40))
def test_no_mutation_ever_reaches_the_queues(ops):
    s = make_scheduler("chunked", num_pages=64, max_running=4, token_budget=16, reserve="estimate")
    for k, (op, n) in enumerate(ops):
        if op == "arrive":
            s.add_request(req(k, n, n % 5 + 1, arrival=0.001 * k), 0.001 * k)
        elif op == "step":
            step(s, 0.001 * k)
        before = queues(s)
        view = s.view(0.001 * k)
        assert try_to_mutate(view) == []
        assert queues(s) == before
        assert list(view.waiting) == s.waiting


def protocol_members() -> set[str]:
    return {n for n in vars(SchedulerView) if not n.startswith("_")}


def test_the_view_has_exactly_the_protocols_members():
    view = busy_scheduler().view(0.0)
    public = {n for n in dir(view) if not n.startswith("_")}
    assert public == protocol_members()


def test_accessors_tell_pages_held_and_admission_order():
    s = busy_scheduler(page_size=4)
    view = s.view(0.0)
    assert [view.pages_held(r) for r in view.running] == [-(-r.cached_len // 4) for r in view.running]
    assert [view.pages_held(r) for r in view.waiting] == [0] * len(view.waiting)
    ranks = [view.admission_order(r) for r in view.running]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def test_the_view_is_frozen():
    view = busy_scheduler().view(0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.free_pages = 10**9  # type: ignore[misc]


# ---- eviction orders ---------------------------------------------------------------------------
def node_view_members() -> set[str]:
    return {n for n in vars(NodeView) if not n.startswith("_")}


def test_a_radix_node_has_every_member_of_the_node_view():
    c = RadixCache(2, eviction_key("lru"))
    c.insert(np.arange(6, dtype=np.int32), np.arange(3, dtype=np.int64), priority=3)
    (node,) = c.nodes()
    assert all(isinstance(getattr(node, m), int) for m in node_view_members())


@pytest.mark.parametrize("name", EVICTIONS.names())
def test_every_eviction_order_reads_only_the_node_view(name):
    # the key must give the same answer for a bare object with nothing but NodeView's members
    key = eviction_key(name)
    c = RadixCache(2, key)
    c.insert(np.arange(6, dtype=np.int32), np.arange(3, dtype=np.int64), priority=3)
    c.match(np.arange(6, dtype=np.int32))
    (node,) = c.nodes()
    bare = SimpleNamespace(**{m: getattr(node, m) for m in node_view_members()})
    assert key(bare) == key(node)
