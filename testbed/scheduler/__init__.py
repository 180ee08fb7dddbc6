"""The scheduler core: queues, KV manager, prefix cache; policies plan, it applies. The view
it hands policies is typed in testbed.core (SchedulerView)."""
from testbed.scheduler.scheduler import PlanError, Scheduler, SchedulerConfig, StepStats

__all__ = ["Scheduler", "SchedulerConfig", "StepStats", "PlanError"]
