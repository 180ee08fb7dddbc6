"""A model's warm engine and an executor over it with no scheduler, for the benchmarks that time
synthetic steps by hand (exp_split_kv_kernels.py, exp_full_graph_eager.py). GPU only."""
from __future__ import annotations


def probe_engine(model: str, overrides=()):
    """(model spec, engine settings, warm engine parts, executor, the device's sleep cycles per
    second, None on the CPU) of `model` with dummy weights and the default engine settings, or
    those `overrides` give (engine.device=cpu: the CPU reference path, for tests)."""
    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.profiler import _sleep_cycles_per_s

    cfg = compose([f"model={model}", "model.weights=dummy", "backend=engine", *overrides])
    spec = assemble.model_spec(cfg)
    s = assemble.engine_settings(cfg, spec)
    parts = assemble.engine_parts(cfg)
    ex = EngineExecutor(parts.model, parts.device, s.max_running, None, None, parts.graphs, parts.pieces)
    return spec, s, parts, ex, _sleep_cycles_per_s(parts.device) if parts.device.type == "cuda" else None
