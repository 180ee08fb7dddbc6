"""The simulator's executor: a step's duration from the cost model, synthetic tokens."""
from __future__ import annotations

import numpy as np

from testbed.core import BatchPlan, StepResult


class SimExecutor:
    def __init__(self, cost_model):
        self.cost_model = cost_model

    def run(self, plan: BatchPlan) -> StepResult:
        duration = self.cost_model.step_time(plan.extend_lens, plan.cached_lens)
        # Deterministic stand-in ids (never an EOS: the simulator's lengths come from the
        # trace): distinct per request and position, so finished sequences cached in the
        # radix tree share nothing by accident.
        reqs = [r for r, s in zip(plan.reqs, plan.samples) if s]
        rid = np.fromiter((r.rid for r in reqs), np.int64, len(reqs))
        pos = np.fromiter((r.device_len for r in reqs), np.int64, len(reqs))
        tokens = (rid * 1_000_003 + pos) % 1_000_000_000 + 1_000_000_000  # < 2**31: int32 like prompt ids
        return StepResult(duration=duration, tokens=tokens, predicted=duration)
