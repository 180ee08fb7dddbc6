"""Step-time cost models for the simulator (no torch).

Public API::

    from testbed.sim.costmodel import make_cost_model, load_hardware
    cm = make_cost_model("roofline", spec, "h200", {"tp": 1})
    cm.step_time(extend_lens, cached_lens)   # seconds
    cm.breakdown(extend_lens, cached_lens)   # seconds per term

A new model is a new module here registering itself with ``@COST_MODELS.register`` and
named in ``COST_MODELS`` (base.py); ``make_cost_model`` imports it on first use of the name.
"""

from testbed.sim.costmodel.base import COST_MODELS, CostModel, StepCost, as_batch, make_cost_model
from testbed.sim.costmodel.hardware import HardwareSpec, available_hardware, load_hardware
from testbed.sim.costmodel.roofline import TERMS, RooflineConfig, RooflineCostModel, allowed_tp

__all__ = [
    "COST_MODELS",
    "CostModel",
    "HardwareSpec",
    "StepCost",
    "RooflineConfig",
    "RooflineCostModel",
    "TERMS",
    "allowed_tp",
    "as_batch",
    "available_hardware",
    "load_hardware",
    "make_cost_model",
]
