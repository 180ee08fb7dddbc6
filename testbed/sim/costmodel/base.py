"""Cost-model interface, batch validation and the registry by name.

Every step is described the same way: request ``i`` of the batch extends its sequence by
``extend_lens[i]`` new tokens on top of ``cached_lens[i]`` tokens already in the KV cache.
A decode is ``extend 1`` over its context; a prefill chunk is ``extend n`` over its cached
prefix (0 for a fresh prompt, the prefix-cache hit or the earlier chunks otherwise).

A cost model is found by name::

    cm = make_cost_model("roofline", model_spec, "h200", {"tp": 2})
    dt = cm.step_time(np.array([1, 1, 512]), np.array([1000, 37, 0]))

Adding one is adding one module ``testbed/sim/costmodel/<name>.py`` that decorates its
factory with ``@register_cost_model("<name>", config_cls=...)``: ``make_cost_model`` imports
that module on first use of the name.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from testbed.modelspec import ModelSpec
from testbed.sim.costmodel.hardware import HardwareSpec, load_hardware, to_plain

__all__ = [
    "CostModel",
    "StepCost",
    "register_cost_model",
    "make_cost_model",
    "available_cost_models",
    "as_batch",
    "build_config",
]


@dataclasses.dataclass(frozen=True, slots=True)
class StepCost:
    """Where one step's time goes (seconds), as the simulator's executor models it (the
    engine's overlap protocol, testbed/sim/executor.py):

    host: on the host before the device can start the step (schedule, batch build, upload);
    launch: on the host enqueueing its kernels, while the device may already run them (the
        device cannot finish before the last kernel is enqueued);
    device: the device's own time for the step, when it never waits for the host;
    complete: on the host applying the step's result (tokens, finishes, KV release).
    """
    host: float
    launch: float
    device: float
    complete: float


@runtime_checkable
class CostModel(Protocol):
    """Predicts the time of one engine step (seconds)."""

    #: (idle gap s, host factor, launch factor): a step launched after the host sat idle for
    #: longer than the gap has its host and launch times multiplied so; None: no such effect
    wake: tuple[float, float, float] | None

    def step_time(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> float:
        """Device seconds for one step that runs the given batch (``step_cost(...).device``)."""
        ...

    def step_cost(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> StepCost:
        """Host and device seconds of one step."""
        ...

    def breakdown(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> dict[str, float]:
        """Seconds per term; the values sum to ``step_time`` of the same batch."""
        ...


def as_batch(extend_lens: Any, cached_lens: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch and return it as two 1-D int64 arrays (no copy when already so)."""
    n = np.asarray(extend_lens, dtype=np.int64)
    c = np.asarray(cached_lens, dtype=np.int64)
    if n.ndim != 1 or c.ndim != 1:
        raise ValueError(
            f"extend_lens and cached_lens must be 1-D, got shapes {n.shape} and {c.shape}"
        )
    if n.shape[0] != c.shape[0]:
        raise ValueError(
            f"extend_lens and cached_lens differ in length: {n.shape[0]} != {c.shape[0]}"
        )
    if n.shape[0] == 0:
        raise ValueError("empty batch: a step needs at least one request")
    if n.min() < 1:
        raise ValueError(f"extend_lens must be >= 1, got min {int(n.min())}")
    if c.min() < 0:
        raise ValueError(f"cached_lens must be >= 0, got min {int(c.min())}")
    return n, c


# ---------------------------------------------------------------------- registry
_Factory = Callable[[ModelSpec, HardwareSpec, Any], CostModel]
_REGISTRY: dict[str, tuple[_Factory, type | None]] = {}


def register_cost_model(name: str, config_cls: type | None = None):
    """Decorator: register ``factory(model_spec, hardware, cfg)`` under ``name``.

    ``config_cls`` (a dataclass) is what ``make_cost_model`` turns a dict / DictConfig into
    before calling the factory; unknown keys fail with the allowed list.
    """

    def deco(factory: _Factory) -> _Factory:
        if name in _REGISTRY and _REGISTRY[name][0] is not factory:
            raise ValueError(f"cost model {name!r} is already registered")
        _REGISTRY[name] = (factory, config_cls)
        return factory

    return deco


def available_cost_models() -> list[str]:
    """Names registered so far (modules not yet imported are not listed)."""
    return sorted(_REGISTRY)


def _lookup(name: str) -> tuple[_Factory, type | None]:
    if name not in _REGISTRY:
        if name.isidentifier():
            try:
                importlib.import_module(f"{__package__}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{__package__}.{name}":
                    raise
    if name not in _REGISTRY:
        raise ValueError(
            f"costmodel.name={name!r} is unknown; allowed: {available_cost_models()}"
        )
    return _REGISTRY[name]


def build_config(config_cls: type, cfg: Any, *, prefix: str = "costmodel") -> Any:
    """Turn None / dict / DictConfig / an instance into ``config_cls``.

    A ``name`` key (the Hydra group file carries one) is dropped. Unknown keys raise
    ``ValueError`` naming the key and the allowed ones.
    """
    if cfg is None:
        return config_cls()
    if isinstance(cfg, config_cls):
        return cfg
    cfg = to_plain(cfg)
    if not isinstance(cfg, Mapping):
        raise ValueError(
            f"{prefix}: expected a mapping or {config_cls.__name__}, got {type(cfg).__name__}"
        )
    allowed = [f.name for f in dataclasses.fields(config_cls)]
    kwargs = {k: v for k, v in cfg.items() if k != "name"}
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"{prefix}: unknown key(s) {unknown}; allowed: {allowed}")
    return config_cls(**kwargs)


def make_cost_model(
    name: str,
    model_spec: ModelSpec,
    hardware: HardwareSpec | str | Mapping[str, Any],
    cfg: Any = None,
) -> CostModel:
    """Build the cost model registered as ``name``.

    ``hardware``: a ``HardwareSpec``, a name of conf/hardware/<name>.yaml, a yaml path, or
    a mapping (the Hydra ``hardware`` node). ``cfg``: the model's config dataclass, a dict
    or DictConfig of its fields (a ``name`` key is ignored), or None for the defaults.
    """
    if not isinstance(model_spec, ModelSpec):
        raise TypeError(f"model_spec must be a ModelSpec, got {type(model_spec).__name__}")
    factory, config_cls = _lookup(name)
    hw = load_hardware(hardware)
    if config_cls is not None:
        cfg = build_config(config_cls, cfg)
    return factory(model_spec, hw, cfg)
