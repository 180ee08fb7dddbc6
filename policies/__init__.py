"""Policies found by name: scheduling policies in policies/scheduling/<name>.py (one Policy
subclass each, its knobs its `Config`), eviction orders in policies/eviction/<name>.py (a `key`
function each). The module name is the config name; nothing else lists them."""
from __future__ import annotations

import dataclasses

from policies.base import ORDERS, RESERVES, Policy, PolicyConfig, own_knobs
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


POLICIES = Registry("policy.name", package="policies.scheduling", pick=_one_policy_class,
                    config_of=lambda cls: cls.Config)
EVICTIONS = Registry("eviction.name", package="policies.eviction", pick=_key_function)


def make_policy(cfg: PolicyConfig) -> Policy:
    return POLICIES.get(cfg.name).obj(cfg)


def policy_config(name: str, **knobs) -> PolicyConfig:
    """Policy `name`'s config (its own class) with `knobs` set; a knob it does not have is an
    error naming the ones it has."""
    cls = POLICIES.get(name).config
    allowed = [f.name for f in dataclasses.fields(cls) if f.name != "name"]
    unknown = sorted(set(knobs) - set(allowed))
    if unknown:
        raise ValueError(f"policy={name} has no knob {', '.join(unknown)}; its knobs: {', '.join(allowed)}")
    return cls(name=name, **knobs)


def config_like(cfg: PolicyConfig, name: str) -> PolicyConfig:
    """Policy `name`'s config with the knobs every policy has taken from `cfg` (its own at
    their defaults, or cfg's when it is the same policy)."""
    if name == cfg.name:
        return cfg
    common = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(PolicyConfig) if f.name != "name"}
    return policy_config(name, **common)


def eviction_key(name: str):
    return EVICTIONS.get(name).obj


__all__ = ["Policy", "PolicyConfig", "ORDERS", "RESERVES", "POLICIES", "EVICTIONS", "make_policy", "policy_config",
           "config_like", "own_knobs", "eviction_key"]
