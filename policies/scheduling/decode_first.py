from dataclasses import dataclass
from typing import ClassVar

from testbed.core import BatchPlan, SchedulerView

from policies.base import Policy, PolicyConfig


@dataclass
class DecodeFirstConfig(PolicyConfig):
    name: str = "decode_first"
    max_prefill_tokens: int = 8192  # a step's tokens, decodes included (vLLM's max_num_batched_tokens)
    step_budget_key: ClassVar[str] = "max_prefill_tokens"


class DecodeFirst(Policy):
    """vLLM V1 style: every running decode first, then the rest of the step's token budget
    for prefills: those already under way, then new ones in queue order, chunked when they
    do not fit. The step budget here is max_prefill_tokens (decodes included), like vLLM's
    max_num_batched_tokens; decodes beyond the budget wait for the next step."""
    name = "decode_first"
    Config = DecodeFirstConfig
    repeats_decodes = True  # plan() reads the queues, the budget and admit's KV check only

    def plan(self, view: SchedulerView) -> BatchPlan:
        plan = BatchPlan()
        budget = self.cfg.step_budget()
        prefilling = []
        decodes = []
        for r in view.running:  # the hot loop of every step: plain attributes, no helpers
            if r.device_len - r.cached_len > 1:
                prefilling.append(r)
            else:
                decodes.append(r)
        decodes = decodes[:budget]
        plan.reqs.extend(decodes)
        plan.num_tokens.extend([1] * len(decodes))
        budget -= len(decodes)
        for r in prefilling:
            if budget <= 0:
                break
            n = min(r.extend_len, self.chunk_cap(budget))
            plan.add(r, n)
            budget -= n
        self.admit(view, plan, budget)
        return plan
