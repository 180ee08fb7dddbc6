from testbed.core import BatchPlan

from policies.base import Policy


class DecodeFirst(Policy):
    """vLLM V1 style: every running decode first, then the rest of the step's token budget
    for prefills: those already under way, then new ones in queue order, chunked when they
    do not fit. The step budget here is max_prefill_tokens (decodes included), like vLLM's
    max_num_batched_tokens; decodes beyond the budget wait for the next step."""
    name = "decode_first"

    def step_budget(self) -> int:
        return self.cfg.max_prefill_tokens

    def plan(self, view) -> BatchPlan:
        plan = BatchPlan()
        budget = self.step_budget()
        prefilling = []
        for r in view.running:
            if r.in_prefill:
                prefilling.append(r)
            elif budget > 0:
                plan.add(r, 1)
                budget -= 1
        for r in prefilling:
            if budget <= 0:
                break
            n = min(r.extend_len, self.chunk_cap(budget))
            plan.add(r, n)
            budget -= n
        self.admit(view, plan, budget, self.kv_left(view))
        return plan
