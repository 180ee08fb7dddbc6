"""Structured configs (the Hydra schema) and their checks. A bad value fails at start
with one line naming the key, the value and what is allowed."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from policies import PolicyConfig
from testbed.engine.options import KERNELS, PREFILL_BACKENDS
from testbed.modelspec import ModelConfig
from testbed.traces import TraceConfig

BACKENDS = ("sim", "engine")
DTYPES = ("bfloat16", "float16", "float32")


class ConfigError(ValueError):
    pass


@dataclass
class BackendConfig:
    name: str = "sim"


@dataclass
class NamedConfig:
    name: str = ""


@dataclass
class EngineConfig:
    """The deployment both backends describe: the simulator sizes its KV pool and cost
    model from it exactly as the engine does."""
    tp: int = 1
    page_size: int = 1
    mem_fraction: float = 0.9  # of device memory for weights + KV pool
    num_pages: Optional[int] = None  # fixed KV pool size; None: from memory
    device: str = "cuda"  # cuda | cpu (the engine's torch reference path)
    attention: str = "flashinfer"  # flashinfer | torch
    kernels: str = "auto"  # elementwise ops: triton | torch | auto (triton on CUDA, torch on the CPU)
    # flashinfer decode through its tensor-core (prefill) kernel; null: when q heads / kv heads >= 4
    decode_tensor_cores: Optional[bool] = None
    prefill_backend: str = "fa2"  # flashinfer prefill kernel template: fa2 | fa3 (Hopper)
    dtype: str = "bfloat16"
    overlap: bool = True
    cuda_graph_max_bs: int = 256  # decode CUDA graphs up to this batch; 0 disables them
    # CUDA graphs for the other steps (prefill, mixed, decode beyond the graphs), in pieces
    # between the attention calls, for token counts up to the policy's step budget
    piecewise_graphs: bool = True
    warmup: bool = True  # run every kind of step once before the first arrival (GPU: compile outside the clock)
    ignore_eos: bool = True
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    debug_plan_hash: bool = False  # TP: compare a hash of every plan across ranks


@dataclass
class SLOConfig:
    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None


@dataclass
class Config:
    backend: BackendConfig = field(default_factory=BackendConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    eviction: NamedConfig = field(default_factory=lambda: NamedConfig("lru"))
    cache: NamedConfig = field(default_factory=lambda: NamedConfig("radix"))
    trace: TraceConfig = field(default_factory=TraceConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("llama3_8b", "hf/llama3_8b.json"))
    hardware: Any = None  # conf/hardware/*.yaml, checked by load_hardware
    costmodel: Any = None  # conf/costmodel/*.yaml, checked by make_cost_model
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    seed: int = 0
    progress: bool = True
    check_every_step: bool = False  # KV integrity check after every step (slow; debugging)


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="config_schema", node=Config)


def check(cfg: Config) -> None:
    def bad(key, value, allowed):
        raise ConfigError(f"{key}={value!r} is invalid; allowed: {allowed}")
    if cfg.backend.name not in BACKENDS:
        bad("backend", cfg.backend.name, ", ".join(BACKENDS))
    e = cfg.engine
    if e.tp < 1:
        bad("engine.tp", e.tp, "an integer >= 1")
    if e.page_size < 1:
        bad("engine.page_size", e.page_size, "an integer >= 1")
    if not (0.0 < e.mem_fraction <= 1.0):
        bad("engine.mem_fraction", e.mem_fraction, "a number in (0, 1]")
    if e.dtype not in DTYPES:
        bad("engine.dtype", e.dtype, ", ".join(DTYPES))
    if e.num_pages is not None and e.num_pages < 1:
        bad("engine.num_pages", e.num_pages, "null (size from memory) or an integer >= 1")
    if e.kernels not in KERNELS:
        bad("engine.kernels", e.kernels, ", ".join(KERNELS))
    if e.prefill_backend not in PREFILL_BACKENDS:
        bad("engine.prefill_backend", e.prefill_backend, ", ".join(PREFILL_BACKENDS))
    for key in ("ttft_ms", "tpot_ms"):
        v = getattr(cfg.slo, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf")):
            bad(f"slo.{key}", v, "null (no SLO) or a number of milliseconds > 0")
    try:
        cfg.policy.validate()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def compose(overrides: list[str]) -> Config:
    """The run config of `python -m testbed.run OVERRIDES...`, for tools with their own entry
    point (testbed.profile, testbed.fidelity): the same groups, schema and checks."""
    from pathlib import Path

    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_schema()
    conf_dir = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        dcfg = hydra_compose(config_name="config", overrides=list(overrides))
    cfg = OmegaConf.to_object(dcfg)
    check(cfg)
    return cfg
