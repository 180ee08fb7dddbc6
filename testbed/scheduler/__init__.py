"""The scheduler core: queues, KV manager, prefix cache; policies plan, it applies."""
from testbed.scheduler.scheduler import PlanError, Scheduler, SchedulerConfig, StepStats
from testbed.scheduler.view import SchedulerView

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerView", "StepStats", "PlanError"]
