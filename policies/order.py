"""Queue orders for waiting requests (policy.order). Each returns the waiting requests in
the order a policy should consider them; ties always break by arrival, then id."""
from __future__ import annotations

from typing import Sequence

from testbed.core import Request, SchedulerView


def fcfs(view: SchedulerView) -> Sequence[Request]:
    return view.waiting  # the scheduler keeps it in (arrival, rid) order


def sjf(view: SchedulerView) -> Sequence[Request]:
    """Shortest job (prompt still to compute) first."""
    return sorted(view.waiting, key=lambda r: (r.device_len, r.arrival, r.rid))


def lpm(view: SchedulerView) -> Sequence[Request]:
    """Longest cached prefix first (SGLang's cache-aware order)."""
    return sorted(view.waiting, key=lambda r: (-view.prefix_match(r), r.arrival, r.rid))


def priority(view: SchedulerView) -> Sequence[Request]:
    """Highest priority first, then arrival."""
    return sorted(view.waiting, key=lambda r: (-r.priority, r.arrival, r.rid))


_ORDERS = {"fcfs": fcfs, "sjf": sjf, "lpm": lpm, "priority": priority}


def make_order(name: str):
    try:
        return _ORDERS[name]
    except KeyError:
        raise ValueError(f"unknown policy.order {name!r}; known: {', '.join(_ORDERS)}") from None
