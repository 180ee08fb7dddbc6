"""The scheduler's settings: the deployment's limits, the KV pool, the context limit and the
prefix cache."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchedulerLimits:
    """What the deployment allows whatever the policy (the run's `scheduler.*`): they size the
    engine, and the simulator keeps to them as the engine must. A policy reads them on its view."""
    max_running: int = 256  # requests running at once: page-table rows, the largest decode batch
    # the most tokens one step may hold: the engine's step buffers, piecewise CUDA graphs and
    # warm-up are sized to it; a policy's step budget must fit it
    max_step_tokens: int = 8192

    def validate(self) -> None:
        for key in ("max_running", "max_step_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"scheduler.{key}={getattr(self, key)!r} is invalid; allowed: an integer >= 1")
        if self.max_step_tokens < self.max_running:  # a decode of every running request is one step
            raise ValueError(f"scheduler.max_step_tokens={self.max_step_tokens} is invalid; allowed: at least "
                             f"scheduler.max_running={self.max_running} (a decode step of every running request)")

    def check_policy(self, policy_cfg) -> None:
        """A policy's step budget (policies.base.PolicyConfig.step_budget) must fit a step."""
        budget = policy_cfg.step_budget()
        if budget is not None and budget > self.max_step_tokens:
            raise ValueError(f"policy.{policy_cfg.step_budget_key}={budget} is more than a step may hold "
                             f"(scheduler.max_step_tokens={self.max_step_tokens}); raise scheduler.max_step_tokens")


@dataclass
class SchedulerConfig:
    num_pages: int = 65536
    page_size: int = 1
    max_context: int = 131072  # longest sequence (prompt + output) the model takes
    cache: str = "radix"  # radix | none
    eviction: str = "lru"
    check_every_step: bool = False  # run the KV integrity check after every step (tests, debugging)
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)

    def validate(self) -> None:
        for key in ("num_pages", "page_size", "max_context"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r} is invalid; allowed: an integer >= 1")
        self.limits.validate()
