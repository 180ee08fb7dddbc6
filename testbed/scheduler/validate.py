"""The check a policy's plan must pass before the scheduler applies any of it."""
from __future__ import annotations

from testbed.core import BatchPlan, Request, RequestState


class PlanError(ValueError):
    """A policy returned a plan the scheduler cannot apply (a bug in the policy)."""


def validate_plan(plan: BatchPlan, owners: list[Request | None], stamp: int, max_step_tokens: int) -> None:
    """Raise PlanError unless every item is a waiting request or a running one with tokens
    left to compute, none twice, the plan's tokens within max_step_tokens (what the engine's
    step buffers hold), and every preemption a running request no step in flight uses.
    owners: the row owners; stamp: a mark fresh for this plan. Costs O(plan): membership by
    state and row, not by scanning queues."""
    reqs, ntoks = plan.reqs, plan.num_tokens
    if len(ntoks) != len(reqs):
        raise PlanError("plan.reqs and plan.num_tokens differ in length")
    if sum(ntoks) > max_step_tokens:
        raise PlanError(f"the plan holds {sum(ntoks)} tokens, more than a step may hold "
                        f"(scheduler.max_step_tokens={max_step_tokens})")
    RUNNING = RequestState.RUNNING
    for r, n in zip(reqs, ntoks):
        if r.plan_stamp == stamp:
            raise PlanError(f"request {r.rid} appears twice in the plan")
        r.plan_stamp = stamp
        if r.state is RUNNING and r.row >= 0 and owners[r.row] is r:
            if not (1 <= n <= r.device_len - r.cached_len) or r.device_len >= r.prompt_len + r.max_new_tokens:
                raise PlanError(f"request {r.rid}: {n} tokens asked, {r.extend_len} can run")
        elif r.queued:
            if not (1 <= n <= r.device_len):
                raise PlanError(f"request {r.rid}: {n} tokens asked, prompt has {r.device_len}")
        else:
            raise PlanError(f"request {r.rid} ({r.state.name}) is neither waiting nor schedulable")
    for r in plan.preempt:
        if r.state is not RUNNING or r.row < 0 or owners[r.row] is not r or r.inflight:
            raise PlanError(f"request {r.rid} cannot be preempted (not running, or in a step in flight)")
        if r.plan_stamp == stamp:
            raise PlanError(f"request {r.rid} is both run and preempted")
