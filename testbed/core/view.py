"""What a policy may read: the scheduler's view of one step, and a prefix-cache node's view
for an eviction order. Both live here, at the bottom, so that policies can name their types
without importing the scheduler or the KV layer."""
from __future__ import annotations

from typing import Protocol, Sequence

from testbed.core.request import Request


class SchedulerView(Protocol):
    """The scheduler as a policy sees it while planning one step. Every member is read-only;
    the queues are read-only sequences over the scheduler's own (no copy per step), so they
    are valid for the step they were handed out in, not to be kept."""

    @property
    def now(self) -> float: ...

    @property
    def step_id(self) -> int: ...

    @property
    def waiting(self) -> Sequence[Request]:
        """WAITING and PREEMPTED requests, in (arrival, rid) order."""

    @property
    def running(self) -> Sequence[Request]:
        """RUNNING requests that can take a step, in admission order."""

    @property
    def max_running(self) -> int:
        """The deployment's cap on requests running at once (scheduler.max_running)."""

    @property
    def free_rows(self) -> int:
        """How many requests may be admitted now: the page-table rows no request holds. Fewer
        than max_running - len(running) while a step in flight holds the last token of a
        request it ends (running leaves that request out; its row is free once the step
        completes)."""

    @property
    def max_step_tokens(self) -> int:
        """The most tokens a step may hold (scheduler.max_step_tokens): a plan over it is refused."""

    @property
    def page_size(self) -> int: ...

    @property
    def total_pages(self) -> int: ...

    @property
    def free_pages(self) -> int: ...

    @property
    def evictable_pages(self) -> int:
        """Pages of unreferenced prefix-cache nodes: free once evicted."""

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far in the run."""

    def pages_held(self, req: Request) -> int:
        """KV pages mapped for req now (its shared prefix and its own); 0 unless running."""

    def admission_order(self, req: Request) -> int:
        """Rank of req's latest (re)admission: a later admission has a larger rank."""

    def prefix_match(self, req: Request) -> int:
        """Tokens of req's known sequence the prefix cache would give it now (page aligned,
        at most device_len - 1: the last token is always computed)."""

    def prefix_match_cost(self, req: Request) -> tuple[int, int]:
        """(prefix_match(req), evictable pages that admitting req would pin): those leave
        the evictable pool the moment req is admitted, so an admission must count them."""


class NodeView(Protocol):
    """What an eviction order's key may read of an evictable prefix-cache node. The cache
    hands the key the node itself, typed as this view, not a snapshot: building one per leaf
    per eviction scan cost about 4% of a simulator run."""

    @property
    def last_access(self) -> int:
        """Cache tick of the last match or insert through the node."""

    @property
    def hits(self) -> int:
        """Prefix hits counted on the node."""

    @property
    def created(self) -> int:
        """Cache tick its tokens were first inserted."""

    @property
    def priority(self) -> int:
        """The highest priority of the requests that used the node."""

    @property
    def num_pages(self) -> int:
        """Pages its eviction frees."""
