"""What both drivers record after each step (one steps.parquet row), from the scheduler's
state and the plan, so the simulator and the engine fill the schema the same way."""
from __future__ import annotations

from testbed.core import BatchPlan
from testbed.timeline import StepLog


def record_step(log: StepLog, sched, plan: BatchPlan, start: float, end: float, duration: float,
                predicted: float | None, host: float, launch: float, complete: float) -> None:
    """start: the loop began scheduling the step; end: its result was collected. duration: the
    step's device time (the engine's CUDA events, the simulator's modelled device busy time);
    host / launch / complete: host seconds before the device could start it, enqueueing it,
    and applying its result."""
    st = sched.stats_of(plan)
    log.output_tokens += plan.num_samples
    free = sched.allocator.free_pages
    cached = sched.cache.cached_pages
    log.append(
        step=plan.step_id, start_s=start, end_s=end, duration_s=duration, predicted_s=predicted,
        host_s=host, launch_s=launch, complete_s=complete,
        batch_reqs=len(plan), prefill_reqs=st.prefill_reqs, prefill_tokens=st.prefill_tokens,
        decode_reqs=st.decode_reqs, decode_tokens=st.decode_tokens,
        context_tokens=plan.kv_tokens,
        running=len(sched.running), waiting=len(sched.waiting),
        pages_used=sched.kv.owned_pages, pages_cached=cached, pages_free=free,
        evicted_pages=st.evicted_pages, preempted=st.preempted, admitted=st.admitted,
    )
