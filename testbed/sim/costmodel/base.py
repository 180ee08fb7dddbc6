"""Cost-model interface, batch validation and the registry by name.

Every step is described the same way: request ``i`` of the batch extends its sequence by
``extend_lens[i]`` new tokens on top of ``cached_lens[i]`` tokens already in the KV cache.
A decode is ``extend 1`` over its context; a prefill chunk is ``extend n`` over its cached
prefix (0 for a fresh prompt, the prefix-cache hit or the earlier chunks otherwise).

A cost model is found by name::

    cm = make_cost_model("roofline", model_spec, "h200", {"tp": 2})
    dt = cm.step_time(np.array([1, 1, 512]), np.array([1000, 37, 0]))

Adding one is adding one module ``testbed/sim/costmodel/<name>.py`` that decorates its
factory with ``@COST_MODELS.register("<name>", config=...)`` and listing the name in
``COST_MODELS`` below: ``make_cost_model`` imports that module on first use of the name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from testbed.core.registry import Registry, read_config
from testbed.modelspec import ModelSpec
from testbed.sim.costmodel.hardware import HardwareSpec, load_hardware, to_plain

__all__ = [
    "CostModel",
    "StepCost",
    "COST_MODELS",
    "make_cost_model",
    "as_batch",
    "decode_costs",
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

    #: (idle gap s, host factor, launch factor, device s): a step launched after the host sat
    #: idle for longer than the gap has its host and launch times multiplied so and its device
    #: time lengthened so; None: no such effect
    wake: tuple[float, float, float, float] | None

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
# costmodel.name -> factory(model_spec, hardware, cfg), with its config dataclass; each
# module registers its own with @COST_MODELS.register(name, config=...) when imported
COST_MODELS = Registry("costmodel.name", modules={
    name: f"testbed.sim.costmodel.{name}" for name in ("auto", "calibrated", "roofline")})


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
    entry = COST_MODELS.get(name)
    hw = load_hardware(hardware)
    if entry.config is not None:
        cfg = read_config(entry.config, to_plain(cfg), "costmodel")
    return entry.obj(model_spec, hw, cfg)


def decode_costs(cm, cached: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """host, launch, device and complete seconds (an array each, a value per step) of k decode
    steps of one batch whose contexts start at `cached` and grow by one token a step (step j:
    cached + j): what step_cost gives each, float for float. From the model's own vectorised
    `decode_costs` where it has one, else step_cost step by step (the simulator's fast path,
    testbed/sim/fastpath.py)."""
    own = getattr(cm, "decode_costs", None)
    return own(cached, k) if own is not None else costs_step_by_step(cm, cached, k)


def costs_step_by_step(cm, cached: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """decode_costs from cm.step_cost, one step at a time."""
    ones = np.ones(len(cached), np.int64)
    costs = [cm.step_cost(ones, cached + j) for j in range(k)]
    return tuple(np.array([getattr(c, f) for c in costs], float) for f in ("host", "launch", "device", "complete"))
