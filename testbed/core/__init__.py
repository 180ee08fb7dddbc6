"""The ledger types every other part of testbed speaks: requests, plans, step results."""
from testbed.core.plan import BatchPlan, StepResult
from testbed.core.request import TERMINAL_STATES, Request, RequestState, SamplingParams

__all__ = ["BatchPlan", "StepResult", "Request", "RequestState", "SamplingParams", "TERMINAL_STATES"]
