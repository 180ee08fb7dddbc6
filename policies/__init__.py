"""Policies found by name: scheduling policies in policies/scheduling/<name>.py (one Policy
subclass each), eviction orders in policies/eviction/<name>.py (a `key` function each). The
module name is the config name; nothing else lists them."""
from __future__ import annotations

from policies.base import ORDERS, RESERVES, Policy, PolicyConfig
from testbed.core.registry import Registry


def _one_policy_class(module) -> type[Policy]:
    classes = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Policy) and v.__module__ == module.__name__]
    if len(classes) != 1:
        raise TypeError(f"{module.__file__} must define exactly one Policy subclass")
    return classes[0]


def _key_function(module):
    if not callable(getattr(module, "key", None)):
        raise TypeError(f"{module.__file__} must define key(node: NodeView) -> tuple")
    return module.key


POLICIES = Registry("policy.name", package="policies.scheduling", pick=_one_policy_class)
EVICTIONS = Registry("eviction.name", package="policies.eviction", pick=_key_function)


def make_policy(cfg: PolicyConfig) -> Policy:
    return POLICIES.get(cfg.name).obj(cfg)


def eviction_key(name: str):
    return EVICTIONS.get(name).obj


__all__ = ["Policy", "PolicyConfig", "ORDERS", "RESERVES", "POLICIES", "EVICTIONS", "make_policy", "eviction_key"]
