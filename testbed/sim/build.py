"""Assemble the simulator backend from the config."""
from __future__ import annotations

from testbed.assemble import make_scheduler, sim_kv_pages
from testbed.sim.costmodel import make_cost_model
from testbed.sim.costmodel.hardware import load_hardware
from testbed.sim.driver import SimDriver
from testbed.sim.executor import SimExecutor


def cost_model_for(cfg, spec):
    hw = load_hardware(dict(cfg.hardware))
    cm_cfg = dict(cfg.costmodel or {"name": "roofline"})
    name = cm_cfg.pop("name", "roofline")
    cm_cfg["tp"] = cfg.engine.tp  # the deployment's TP degree, one knob for both backends
    return make_cost_model(name, spec, hw, cm_cfg), hw


def build_sim(cfg, spec, requests):
    cost, hw = cost_model_for(cfg, spec)
    pages = sim_kv_pages(cfg, spec, hw)
    sched = make_scheduler(cfg, spec, pages)
    driver = SimDriver(sched, SimExecutor(cost), requests)
    return driver, sched, {"num_pages": pages, "page_size": cfg.engine.page_size, "cost_model": repr(cost)}
