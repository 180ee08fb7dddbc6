"""Policies found by name: scheduling policies in policies/scheduling/<name>.py (one Policy
subclass each), eviction orders in policies/eviction/<name>.py (a `key` function each)."""
from __future__ import annotations

import importlib
import pkgutil

from policies.base import ORDERS, RESERVES, Policy, PolicyConfig


def _names(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def policy_names() -> list[str]:
    return _names("policies.scheduling")


def eviction_names() -> list[str]:
    return _names("policies.eviction")


def make_policy(cfg: PolicyConfig) -> Policy:
    if cfg.name not in policy_names():
        raise ValueError(f"unknown policy {cfg.name!r}; known: {', '.join(policy_names())}")
    module = importlib.import_module(f"policies.scheduling.{cfg.name}")
    classes = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Policy) and v.__module__ == module.__name__]
    if len(classes) != 1:
        raise TypeError(f"policies/scheduling/{cfg.name}.py must define exactly one Policy subclass")
    return classes[0](cfg)


def eviction_key(name: str):
    if name not in eviction_names():
        raise ValueError(f"unknown eviction {name!r}; known: {', '.join(eviction_names())}")
    return importlib.import_module(f"policies.eviction.{name}").key


__all__ = ["Policy", "PolicyConfig", "ORDERS", "RESERVES", "make_policy", "eviction_key",
           "policy_names", "eviction_names"]
