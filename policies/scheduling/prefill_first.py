from dataclasses import dataclass
from typing import ClassVar

from testbed.core import BatchPlan, SchedulerView

from policies.base import Policy, PolicyConfig


@dataclass
class PrefillFirstConfig(PolicyConfig):
    name: str = "prefill_first"
    max_prefill_tokens: int = 8192  # prefill tokens per step (its decode steps run every running request)
    step_budget_key: ClassVar[str] = "max_prefill_tokens"


class PrefillFirst(Policy):
    """mini-SGLang's default: a prefill batch whenever something can be admitted (or an
    admitted prompt is still being chunked), within max_prefill_tokens and the KV left
    after reserving the running requests; the last admitted may be chunked. Otherwise one
    decode batch of every running request. Prefill and decode never mix."""
    name = "prefill_first"
    Config = PrefillFirstConfig
    repeats_decodes = True  # plan() reads the queues, the budget and admit's KV check only

    def plan(self, view: SchedulerView) -> BatchPlan:
        plan = BatchPlan()
        budget = self.cfg.max_prefill_tokens
        for r in view.running:  # a prompt chunked in an earlier step goes on first (plain attributes: every step)
            if budget > 0 and r.device_len - r.cached_len > 1:
                n = min(r.extend_len, self.chunk_cap(budget))
                plan.add(r, n)
                budget -= n
        self.admit(view, plan, budget, chunk_last_only=True)
        if len(plan):
            return plan
        plan.reqs.extend(view.running)
        plan.num_tokens.extend([1] * len(plan.reqs))
        return plan
