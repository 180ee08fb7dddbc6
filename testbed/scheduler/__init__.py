"""The scheduler core: queues, KV manager, prefix cache; policies plan, it applies."""
from testbed.scheduler.config import SchedulerConfig
from testbed.scheduler.scheduler import Scheduler
from testbed.scheduler.stats import StepStats
from testbed.scheduler.validate import PlanError
from testbed.scheduler.view import SchedulerView

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerView", "StepStats", "PlanError"]
