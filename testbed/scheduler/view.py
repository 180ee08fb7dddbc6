"""The view the scheduler hands a policy each step: testbed.core.SchedulerView, built fresh
per step over the scheduler's live queues."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable

from testbed.core import Request


class ReadOnlySequence(Sequence):
    """A list behind a window without mutating methods: O(1) to build each step, where a
    tuple copy of a long waiting queue would be O(n) per step."""
    __slots__ = ("_items",)

    def __init__(self, items: list):
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self._items[i])  # a copy: a slice must not be a way back to the list
        return self._items[i]

    # the list's own (C) versions, not Sequence's Python loops over __getitem__
    def __iter__(self):
        return iter(self._items)

    def __reversed__(self):
        return reversed(self._items)

    def __contains__(self, x) -> bool:
        return x in self._items

    def index(self, x, start: int = 0, stop: int | None = None) -> int:
        return self._items.index(x, start, len(self._items) if stop is None else stop)

    def count(self, x) -> int:
        return self._items.count(x)

    def __repr__(self) -> str:
        return f"ReadOnlySequence({self._items!r})"


@dataclass(frozen=True, slots=True)
class StepView:
    now: float
    step_id: int
    waiting: ReadOnlySequence  # WAITING and PREEMPTED, in (arrival, rid) order
    running: ReadOnlySequence  # RUNNING and schedulable, in admission order
    max_running: int
    free_rows: int  # page-table rows no request holds (one whose last token is in flight holds its own)
    max_step_tokens: int
    page_size: int
    total_pages: int
    free_pages: int
    evictable_pages: int  # pages of unreferenced prefix-cache nodes
    num_preemptions: int  # so far in the run
    _peek: Callable

    # plain C getters rather than methods: reservations call pages_held for every running
    # request every step
    pages_held = staticmethod(attrgetter("num_pages"))
    admission_order = staticmethod(attrgetter("admit_seq"))

    def prefix_match(self, req: Request) -> int:
        return self.prefix_match_cost(req)[0]

    def prefix_match_cost(self, req: Request) -> tuple[int, int]:
        if req.prompt_ids is None:
            return 0, 0
        ids = req.prompt_ids if req.device_len == req.prompt_len else req.token_ids(req.device_len)
        return self._peek(ids[: req.device_len - 1])
