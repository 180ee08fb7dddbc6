"""Assemble the simulator backend from the config."""
from __future__ import annotations

import simpy

from testbed.assemble import make_scheduler, sim_kv_pages
from testbed.modelspec import check_tp_split
from testbed.sim.costmodel import make_cost_model
from testbed.sim.costmodel.hardware import load_hardware
from testbed.sim.driver import SimDriver
from testbed.sim.executor import SimExecutor


def cost_model_for(cfg, spec):
    if cfg.engine.tp > 1:
        check_tp_split(spec, cfg.engine.tp)
    hw = load_hardware(dict(cfg.hardware))
    cm_cfg = dict(cfg.costmodel or {"name": "roofline"})
    name = cm_cfg.pop("name", "roofline")
    if "tp" in cm_cfg:
        raise ValueError(f"costmodel.tp={cm_cfg['tp']!r} is not a setting; the TP degree is engine.tp")
    cm_cfg["tp"] = cfg.engine.tp  # the deployment's TP degree, one knob for both backends
    if name in ("auto", "calibrated"):
        cm_cfg["policy"] = cfg.policy.name  # the profile's host fit of this policy
    return make_cost_model(name, spec, hw, cm_cfg), hw


def build_sim(cfg, spec, requests):
    cost, hw = cost_model_for(cfg, spec)
    pages = sim_kv_pages(cfg, spec, hw)
    sched = make_scheduler(cfg, spec, pages)
    env = simpy.Environment()
    driver = SimDriver(sched, SimExecutor(cost, lambda: env.now), requests, overlap=cfg.engine.overlap, env=env)
    return driver, sched, {"num_pages": pages, "page_size": cfg.engine.page_size, "cost_model": repr(cost),
                           "overlap": cfg.engine.overlap}
