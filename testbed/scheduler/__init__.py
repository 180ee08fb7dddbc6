"""The scheduler core: queues, KV manager, prefix cache; policies plan, it applies. The view
it hands policies is typed in testbed.core (SchedulerView)."""
from testbed.scheduler.config import SchedulerConfig, SchedulerLimits
from testbed.scheduler.scheduler import Scheduler
from testbed.scheduler.stats import StepStats
from testbed.scheduler.validate import PlanError

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerLimits", "StepStats", "PlanError"]
