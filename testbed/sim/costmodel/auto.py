"""``costmodel=auto`` (the default): the calibrated model when a profile of this hardware and
model is shipped (testbed/sim/costmodel/profiles/<hardware>_<model>.json, same TP degree),
else the roofline with its defaults. The run's summary names the model it got."""
from __future__ import annotations

from dataclasses import dataclass

from testbed.modelspec import ModelSpec
from testbed.sim.costmodel.base import COST_MODELS
from testbed.sim.costmodel.hardware import HardwareSpec


@dataclass
class AutoConfig:
    tp: int = 1
    policy: str = "all"


@COST_MODELS.register("auto", config=AutoConfig)
def _make_auto(spec: ModelSpec, hardware: HardwareSpec, cfg: AutoConfig):
    from testbed.sim.costmodel.calibrated import (CalibratedConfig, CalibratedCostModel, load_profile,
                                                  profile_for, profile_mismatch)
    from testbed.sim.costmodel.roofline import RooflineConfig, RooflineCostModel
    name = profile_for(hardware.name, spec.name)
    prof = load_profile(name) if name is not None else None  # read once, for the check and the model
    if prof is not None and not profile_mismatch(prof, spec, hardware, cfg.tp):
        return CalibratedCostModel(spec, hardware, CalibratedConfig(profile=name, tp=cfg.tp, policy=cfg.policy),
                                   profile=prof)
    return RooflineCostModel(spec, hardware, RooflineConfig(tp=cfg.tp))
