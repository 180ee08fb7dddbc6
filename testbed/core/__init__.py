"""The ledger types every other part of testbed speaks: requests, plans, step results, and
the read-only views policies plan from."""
from testbed.core.plan import BatchPlan, StepResult
from testbed.core.request import TERMINAL_STATES, Request, RequestState, SamplingParams
from testbed.core.view import NodeView, SchedulerView

__all__ = ["BatchPlan", "StepResult", "Request", "RequestState", "SamplingParams", "TERMINAL_STATES",
           "SchedulerView", "NodeView"]
