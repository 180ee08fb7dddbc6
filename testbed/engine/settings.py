"""What the engine is built from: the numbers and names it needs, taken from the run's
config by the composition root (testbed/assemble.py). The engine reads nothing else of the
config, and tensor-parallel ranks receive this (it pickles) instead of the config."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    device: str  # cuda | cpu
    attention: str  # flashinfer | torch
    kernels: str  # auto | torch | triton
    dtype: str
    decode_tensor_cores: bool | None  # flashinfer only; None: the backend decides
    prefill_backend: str  # flashinfer prefill template
    weights: str  # "dummy" (generated from `seed`) or a safetensors directory
    seed: int
    page_size: int
    num_pages: int | None  # fixed KV pool; None: sized from free memory
    mem_fraction: float
    cuda_graph_max_bs: int  # 0: no decode graphs
    piecewise_graphs: bool
    whole_step_graphs: bool  # needs piecewise_graphs (the config checks it)
    warmup: bool
    overlap: bool  # the host prepares step N+1 while the device runs step N
    max_running: int  # scheduler.max_running: page-table rows, the largest decode batch
    max_step_tokens: int  # scheduler.max_step_tokens (>= max_running): the most tokens a step holds
    tp: int = 1
    debug_plan_hash: bool = False
    cpu_threads: int | None = None  # a CPU rank's torch threads; None: the cores over the ranks
