"""The simulator's executor: the engine's launch / collect protocol on modelled times.

`launch(plan)` asks the cost model where the step's time goes (StepCost) and places it on
the simulated timeline as the engine would run it: the host is busy for `host` (schedule,
batch build, upload) then `launch` (enqueueing kernels); the device starts the step at the
later of the end of the step before and the host being ready, and cannot finish before the
last kernel is enqueued. The step loop waits until the handle's `host_done`, then (after
launching the next step, with overlap) until its `ready_at`, and spends `complete_cost`
applying the result. A step launched after the host sat idle (nothing in flight, the last
result applied more than the cost model's wake gap ago) takes its wake factors on its host
and launch times and its wake time on the device, as the engine's first step after a sleep does. Tokens are synthetic; the executor reads nothing of the scheduler
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
        self.applied = None  # when the host has applied the last step's result (None: no step yet)
        self.wake = cost_model.wake  # (gap, host factor, launch factor, device s) or None

    def launch(self, plan: BatchPlan) -> SimHandle:
        c = self.cost_model.step_cost(plan.extend_lens, plan.cached_lens)
        host, host_done, end, duration, self.device_free, self.applied = self.place(
            self.now(), c.host, c.launch, c.device, c.complete, self.device_free, self.applied)
        return SimHandle(plan, synthetic_tokens(plan), host, host_done, end, duration, c.device, c.complete)

    def place(self, t: float, host: float, launch: float, device: float, complete: float, device_free: float,
              applied: float | None) -> tuple[float, float, float, float, float, float]:
        """A step launched at t with these costs after the device's last step ends at
        device_free and its result is applied at `applied`: (its host time, wake factor
        included; host_done; end; device duration; the new device_free and applied). Pure: the
        fast path (testbed/sim/fastpath.py) places its steps with it before committing them."""
        if self.wake is not None and applied is not None and t - applied > self.wake[0]:
            host, launch, device = host * self.wake[1], launch * self.wake[2], device + self.wake[3]
        ready = t + host
        start = max(device_free, ready)
        end = max(start + device, ready + launch)
        return host, ready + launch, end, end - start, end, end + complete  # the loop collects at end, then applies

    def collect(self, h: SimHandle) -> StepResult:
        return StepResult(duration=h.duration, tokens=h.tokens, predicted=h.predicted)

    def close(self, ran_to_end: bool) -> None:
        """Nothing was started."""

    def fill_predictions(self, steps) -> None:
        """Every step's prediction was recorded in the loop."""


def synthetic_tokens(plan: BatchPlan) -> np.ndarray:
    """Deterministic stand-in ids (never an EOS: the simulator's lengths come from the trace):
    distinct per request and position, so finished sequences cached in the radix tree share
    nothing by accident."""
    # one list comprehension, synthetic_id's arithmetic written out (a call per item was half
    # its time): a plan's tens of items cost less so than two fromiter calls
    return np.array([(r.rid * 1_000_003 + r.device_len) % 1_000_000_000 + 1_000_000_000
                     for r, s in zip(plan.reqs, plan.samples.tolist()) if s], np.int64)


def synthetic_id(rid, device_len):
    """The id sampled for request rid when its known tokens reach device_len (ints or int64
    arrays alike): < 2**31, int32 like prompt ids."""
    return (rid * 1_000_003 + device_len) % 1_000_000_000 + 1_000_000_000
