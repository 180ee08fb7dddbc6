"""The read-only view a policy plans from: one per step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from testbed.core import Request


@dataclass(frozen=True, slots=True)
class SchedulerView:
    now: float
    step_id: int
    waiting: Sequence[Request]  # WAITING and PREEMPTED, in (arrival, rid) order
    running: Sequence[Request]  # RUNNING and schedulable, in admission order
    page_size: int
    total_pages: int
    free_pages: int
    evictable_pages: int  # pages of unreferenced prefix-cache nodes
    num_preemptions: int  # so far in the run
    _peek: Callable

    def prefix_match(self, req: Request) -> int:
        """Tokens of req's known sequence the prefix cache would give it now (page aligned,
        at most device_len - 1: the last token is always computed)."""
        return self.prefix_match_cost(req)[0]

    def prefix_match_cost(self, req: Request) -> tuple[int, int]:
        """(prefix_match(req), evictable pages that admitting req would pin): those leave
        the evictable pool the moment req is admitted, so an admission must count them."""
        if req.prompt_ids is None:
            return 0, 0
        ids = req.prompt_ids if req.device_len == req.prompt_len else req.token_ids(req.device_len)
        return self._peek(ids[: req.device_len - 1])
