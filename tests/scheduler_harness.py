"""A minimal synchronous driver for scheduler tests: no simulator, no engine."""
from __future__ import annotations

import numpy as np

from policies import POLICIES, eviction_key, make_policy, policy_config
from testbed.core import Request, StepResult
from testbed.scheduler import Scheduler, SchedulerConfig, SchedulerLimits


def make_scheduler(policy="chunked", num_pages=4096, page_size=1, cache="radix", eviction="lru",
                   max_context=100_000, check=True, max_running=None, max_step_tokens=None, budget=None,
                   **policy_kw) -> Scheduler:
    """A scheduler as a run builds it. max_running, max_step_tokens: the limits (scheduler.*,
    their defaults when None); budget: the policy's step budget, whichever knob it is
    (max_prefill_tokens, token_budget); policy_kw: the policy's knobs."""
    if budget is not None:
        policy_kw[POLICIES.get(policy).config.step_budget_key] = budget
    pol = make_policy(policy_config(policy, **policy_kw))
    given = {"max_running": max_running, "max_step_tokens": max_step_tokens}
    limits = SchedulerLimits(**{k: v for k, v in given.items() if v is not None})
    limits.check_policy(pol.cfg)  # as a run's config check does
    cfg = SchedulerConfig(num_pages=num_pages, page_size=page_size, max_context=max_context, cache=cache,
                          eviction=eviction, check_every_step=check, limits=limits)
    return Scheduler(cfg, pol, eviction_key(eviction))


def req(rid, prompt, out, arrival=0.0, ids=None, **kw) -> Request:
    if ids is None:
        ids = np.arange(prompt, dtype=np.int32) + 1000 * (rid + 1)
    return Request(rid=rid, prompt_len=len(ids), max_new_tokens=out, arrival=arrival, prompt_ids=ids, **kw)


def synthetic_tokens(plan) -> np.ndarray:
    return np.array([r.rid * 7 + r.device_len for r, s in zip(plan.reqs, plan.samples) if s], dtype=np.int64)


def step(s: Scheduler, now: float = 0.0, tokens=None):
    plan = s.schedule(now)
    if plan is None:
        return None, []
    toks = synthetic_tokens(plan) if tokens is None else tokens(plan)
    ended = s.complete(plan, StepResult(duration=0.01, tokens=toks), now + 0.01)
    return plan, ended


def run_all(s: Scheduler, reqs, max_steps=100_000):
    for r in reqs:
        s.add_request(r, 0.0)
    plans = []
    t = 0.0
    while s.has_work() and len(plans) < max_steps:
        plan, _ = step(s, t)
        t += 0.01
        if plan is None:
            raise AssertionError("scheduler stalled with work left")
        plans.append([(r.rid, n) for r, n in zip(plan.reqs, plan.num_tokens)])
    return plans


def shared(prefix: np.ndarray, rid: int, n_own: int) -> np.ndarray:
    """prefix followed by n_own tokens unique to rid."""
    return np.concatenate([prefix, np.arange(n_own, dtype=np.int32) + 10_000 * (rid + 1)]).astype(np.int32)


def finish_all(s: Scheduler, t: float = 0.0, max_steps: int = 10_000) -> float:
    """Step until nothing is left; fails on a stall. Returns the time reached."""
    n = 0
    while s.has_work():
        plan, _ = step(s, t)
        assert plan is not None, "stalled"
        t += 0.01
        n += 1
        assert n < max_steps
    return t


MUTATORS = ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse")


def try_to_mutate(view) -> list[str]:
    """Tries every way a policy might change a queue through the view; returns the ways that
    are open (a mutating method there at all, or an assignment that went through)."""
    worked = []
    for name in ("waiting", "running"):
        seq = getattr(view, name)
        probe = seq[0] if len(seq) else None
        attempts = [(m, lambda m=m: getattr(seq, m)) for m in MUTATORS]
        attempts += [
            ("setitem", lambda: seq.__setitem__(0, probe)),
            ("delitem", lambda: seq.__delitem__(0)),
            ("setslice", lambda: seq.__setitem__(slice(None), [])),
            ("iadd", lambda: seq.__iadd__([probe])),
            ("rebind", lambda: setattr(view, name, [])),
            ("new attr", lambda: setattr(seq, "extra", 1)),
        ]
        for what, attempt in attempts:
            try:
                attempt()
            except (AttributeError, TypeError):
                continue
            worked.append(f"{name}.{what}")
    return worked
