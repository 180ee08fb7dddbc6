"""What a scheduling policy is: an object that turns the scheduler's read-only view into a
BatchPlan. Policies see only the view (testbed.core.SchedulerView) and testbed.core; the
scheduler validates and applies what they return (allocation, eviction, preemption when KV
runs out).

PolicyConfig holds the knobs every policy has (queue order, KV reservation, chunk cap); a
policy's own knobs (its token budget) are a subclass beside it, its `Config`. The
deployment's limits (requests running at once, tokens a step may hold) are not policy knobs:
they size the engine, live in the scheduler's config (scheduler.*) and reach the policy
through the view (view.max_running, view.max_step_tokens)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Sequence

from testbed.core import BatchPlan, Request, SchedulerView

ORDERS = ("fcfs", "sjf", "lpm", "priority")
RESERVES = ("full", "estimate")


@dataclass
class PolicyConfig:
    name: str = "chunked"  # the scheduling policy: a module of policies/scheduling/
    order: str = "fcfs"  # queue order of waiting requests
    reserve: str = "full"  # KV reserved for running requests' remaining output at admission
    chunk_size: int = 0  # most prefill tokens of one request in one step; 0 = no cap beyond the budget
    # reserve=estimate: reserve ratio * remaining output tokens; the ratio decays per step
    # from init to min and goes back to init after a preemption (after SGLang's new_token_ratio)
    estimate_init: float = 0.7  # reserve=estimate: the ratio at start and after a preemption
    estimate_min: float = 0.1  # reserve=estimate: the ratio's floor
    estimate_decay: float = 0.001  # reserve=estimate: the ratio's decrease per step
    # the subclass field that bounds the tokens of the policy's steps, if it has one: it must
    # fit the deployment's scheduler.max_step_tokens (checked at start)
    step_budget_key: ClassVar[str | None] = None

    def step_budget(self) -> int | None:
        return None if self.step_budget_key is None else getattr(self, self.step_budget_key)

    def validate(self) -> None:
        def bad(key, value, allowed):
            raise ValueError(f"policy.{key}={value!r} is invalid; allowed: {allowed}")
        if self.order not in ORDERS:
            bad("order", self.order, ", ".join(ORDERS))
        if self.reserve not in RESERVES:
            bad("reserve", self.reserve, ", ".join(RESERVES))
        if self.step_budget_key is not None and self.step_budget() < 1:
            bad(self.step_budget_key, self.step_budget(), "an integer >= 1")
        if self.chunk_size < 0:
            bad("chunk_size", self.chunk_size, "0 (off) or an integer >= 1")
        if not (0.0 <= self.estimate_min <= self.estimate_init <= 1.0):
            bad("estimate_init/estimate_min", (self.estimate_init, self.estimate_min), "0 <= min <= init <= 1")
        if not (0.0 <= self.estimate_decay <= 1.0):
            bad("estimate_decay", self.estimate_decay, "a number in [0, 1]")


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def own_knobs(config_cls: type[PolicyConfig]) -> list[str]:
    """The fields a policy's config adds to the ones every policy has."""
    common = {f.name for f in fields(PolicyConfig)}
    return [f.name for f in fields(config_cls) if f.name not in common]


class Policy:
    """Subclass, set `name`, implement `plan`; knobs of its own: a PolicyConfig subclass as
    `Config`. One subclass per module in policies/scheduling."""
    name = "base"
    Config: ClassVar[type[PolicyConfig]] = PolicyConfig
    #: plan() reads the view only through what a decode step of every running request leaves
    #: as it was: the queues and their order, which running requests are decodes, the budgets,
    #: and (through `admit`) the KV left after the reservation against an admission's need. Then
    #: a plan of those decodes alone repeats while nothing arrives, ends or is evicted, and the
    #: simulator may run such steps at once (decodes_repeat; testbed/sim/fastpath.py). A policy
    #: reading anything else (the clock, the step number) leaves it False.
    repeats_decodes: ClassVar[bool] = False

    def __init__(self, cfg: PolicyConfig):
        from policies.order import make_order
        from policies.reserve import make_reserve
        if not isinstance(cfg, self.Config):
            raise TypeError(f"policy {self.name} takes a {self.Config.__name__}, got a {type(cfg).__name__} "
                            f"(policies.policy_config({self.name!r}, ...) makes one)")
        cfg.validate()
        self.cfg = cfg
        self.order = make_order(cfg.order)
        self.reserve = make_reserve(cfg)

    def make_plan(self, view: SchedulerView) -> BatchPlan:
        """What the scheduler calls once per step."""
        self.reserve.observe(view)
        return self.plan(view)

    def plan(self, view: SchedulerView) -> BatchPlan:
        raise NotImplementedError

    def decodes_repeat(self, view: SchedulerView) -> bool:
        """Having planned a decode of every running request and nothing else from this view's
        state, whether the next steps' plans are the same while nothing arrives, ends or is
        evicted (see repeats_decodes)."""
        return self.repeats_decodes and self.reserve.holds_over_decodes(view)

    def skip_plans(self, k: int) -> None:
        """k plans were made as decodes_repeat said without asking plan(): the per-step state
        make_plan keeps moves on as k calls would have moved it."""
        self.reserve.skip(k)

    def choose_victim(self, view: SchedulerView, candidates: Sequence[Request]) -> Request:
        """Which running request to preempt when KV runs out: the latest admitted."""
        return max(candidates, key=view.admission_order)

    # ---- helpers shared by the policies ---------------------------------------------------
    def chunk_cap(self, budget: int) -> int:
        return min(budget, self.cfg.chunk_size) if self.cfg.chunk_size else budget

    def admit(self, view: SchedulerView, plan: BatchPlan, budget: int, kv_left: int | None = None,
              chunk_last_only: bool = False) -> int:
        """Admit waiting requests in queue order while they fit the token budget, the free
        rows and the KV left; returns the budget left. Stops at the first request that does
        not fit the KV (no overtaking: the order is the policy's promise). kv_left: the pages
        admissions may use (None: self.kv_left(view), reckoned only when a request could be
        admitted: the reservation sums over every running request, the order may sort the
        queue). chunk_last_only: only the last admitted request may be cut (prefill_first)."""
        # a row for each: a request ending in the step in flight holds its row (view.free_rows)
        room = min(view.max_running - len(view.running), view.free_rows)
        if budget <= 0 or room <= 0 or not view.waiting:
            return budget
        if kv_left is None:
            kv_left = self.kv_left(view)
        for r in self.order(view):
            if budget <= 0 or room <= 0:
                break
            hit, pinned = view.prefix_match_cost(r)
            extend = r.device_len - hit
            need = self.reserve.admission_pages(view, r, hit) + pinned
            if need > kv_left:
                break
            n = min(extend, self.chunk_cap(budget))
            plan.add(r, n)
            budget -= n
            kv_left -= need
            room -= 1
            if n < extend and chunk_last_only:
                break
        return budget

    def kv_left(self, view: SchedulerView) -> int:
        """Pages an admission may use: free + evictable, minus the running requests' reservation."""
        return view.free_pages + view.evictable_pages - self.reserve.running_pages(view)
