"""The simulator's executor: the engine's launch / collect protocol on modelled times.

`launch(plan)` asks the cost model where the step's time goes (StepCost) and places it on
the simulated timeline as the engine would run it: the host is busy for `host` (schedule,
batch build, upload) then `launch` (enqueueing kernels); the device starts the step at the
later of the end of the step before and the host being ready, and cannot finish before the
last kernel is enqueued. The step loop waits until the handle's `host_done`, then (after
launching the next step, with overlap) until its `ready_at`, and spends `complete_cost`
applying the result. Tokens are synthetic; the executor reads nothing of the scheduler
but the plan."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.core import BatchPlan, StepResult


@dataclass(slots=True)
class SimHandle:
    plan: BatchPlan
    tokens: np.ndarray
    prep_s: float  # host time before the device can start (StepCost.host)
    host_done: float  # when the host has launched the step
    ready_at: float  # when the device has finished it
    duration: float  # device busy time, start to end (what the engine's CUDA events measure)
    predicted: float  # the cost model's own device time
    complete_cost: float


class SimExecutor:
    def __init__(self, cost_model, now):
        self.cost_model = cost_model
        self.now = now  # the simulated clock
        self.device_free = 0.0  # when the device finishes the last step launched

    def launch(self, plan: BatchPlan) -> SimHandle:
        c = self.cost_model.step_cost(plan.extend_lens, plan.cached_lens)
        ready = self.now() + c.host
        start = max(self.device_free, ready)
        end = max(start + c.device, ready + c.launch)
        self.device_free = end
        return SimHandle(plan, synthetic_tokens(plan), c.host, ready + c.launch, end, end - start, c.device,
                         c.complete)

    def collect(self, h: SimHandle) -> StepResult:
        return StepResult(duration=h.duration, tokens=h.tokens, predicted=h.predicted)


def synthetic_tokens(plan: BatchPlan) -> np.ndarray:
    """Deterministic stand-in ids (never an EOS: the simulator's lengths come from the trace):
    distinct per request and position, so finished sequences cached in the radix tree share
    nothing by accident."""
    reqs = [r for r, s in zip(plan.reqs, plan.samples) if s]
    rid = np.fromiter((r.rid for r in reqs), np.int64, len(reqs))
    pos = np.fromiter((r.device_len for r in reqs), np.int64, len(reqs))
    return (rid * 1_000_003 + pos) % 1_000_000_000 + 1_000_000_000  # < 2**31: int32 like prompt ids
