"""Assemble the engine backend from the config: model and weights on the device, a KV
pool sized from free memory (or engine.num_pages), the scheduler over that pool."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from testbed.assemble import make_scheduler
from testbed.engine.driver import RealtimeDriver
from testbed.engine.executor import EngineExecutor
from testbed.engine.kernels import resolve_kernels
from testbed.engine.model import build_model, load_weights

log = logging.getLogger(__name__)
HEADROOM_BYTES = 4 << 30  # activations, logits and CUDA graphs beside the KV pool
CPU_DEFAULT_SLOTS = 32768


def kv_slots(cfg, model, device: torch.device) -> int:
    e = cfg.engine
    if e.num_pages is not None:
        return e.num_pages * e.page_size
    per_slot = model.kv_bytes_per_slot()
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = total * e.mem_fraction - (total - free) - HEADROOM_BYTES
        if budget <= per_slot * e.page_size:
            raise ValueError(f"no GPU memory left for the KV cache: {free / 2**30:.1f} GiB free of "
                             f"{total / 2**30:.1f} GiB after the weights; raise engine.mem_fraction or set engine.num_pages")
        return int(budget // (per_slot * e.page_size)) * e.page_size
    log.info("engine on the CPU without engine.num_pages: KV pool of %d slots", CPU_DEFAULT_SLOTS)
    return CPU_DEFAULT_SLOTS


def engine_device(cfg, rank: int = 0) -> torch.device:
    e = cfg.engine
    if e.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("engine.device=cuda but no CUDA device is visible; "
                             "use engine.device=cpu engine.attention=torch")
        return torch.device("cuda", rank)
    if e.device != "cpu":
        raise ValueError(f"engine.device={e.device!r} is invalid; allowed: cuda, cpu")
    if e.attention != "torch":
        raise ValueError(f"engine.attention={e.attention!r} needs a GPU; on engine.device=cpu use engine.attention=torch")
    return torch.device("cpu")


def load_model_for(cfg, spec, device: torch.device, tp_rank: int = 0, tp_size: int = 1, tp_group=None):
    """This rank's shard of the model of shape `spec` (assemble.model_spec: every rank builds
    from rank 0's) with its weights (streamed from model.path, or dummy)."""
    e = cfg.engine
    source = cfg.model.path
    if cfg.model.weights == "real" and not source:
        raise ValueError("model.weights=real needs model.path=DIR (config.json + *.safetensors); "
                         "or use model.weights=dummy")
    torch.manual_seed(cfg.seed)
    options = {}
    if e.decode_tensor_cores is not None:
        if e.attention != "flashinfer":
            raise ValueError(f"engine.decode_tensor_cores is a flashinfer option; engine.attention is {e.attention!r}")
        options["decode_use_tensor_cores"] = e.decode_tensor_cores
    if e.prefill_backend != "fa2":
        if e.attention != "flashinfer":
            raise ValueError(f"engine.prefill_backend is a flashinfer option; engine.attention is {e.attention!r}")
        options["prefill_backend"] = e.prefill_backend
    model = build_model(spec, e.dtype, device, e.attention, tp_rank, tp_size, tp_group, e.kernels, options)
    report = load_weights(model, "dummy" if cfg.model.weights == "dummy" else source, seed=cfg.seed)
    log.info("rank %d weights: %s", tp_rank, report)
    return model, report


@dataclass
class EngineParts:
    """What a run's engine is built from and several runs of one model can share (the
    fidelity experiment replays many cells on one model load): model with its KV pool,
    CUDA graphs, the warm-up already done."""
    device: torch.device
    model: object
    slots: int
    graphs: object
    report: object
    warmup_s: float | None
    pieces: object = None


def build_parts(cfg, spec) -> EngineParts:
    e = cfg.engine
    device = engine_device(cfg)
    model, report = load_model_for(cfg, spec, device)
    slots = kv_slots(cfg, model, device)
    create_pool(model, slots, e.page_size)
    graphs = make_graphs(cfg, model, device, slots // e.page_size, spec.max_context)
    pieces = make_pieces(cfg, model, device, slots // e.page_size)
    parts = EngineParts(device, model, slots, graphs, report, None, pieces)
    parts.warmup_s = warm_up_engine(cfg, spec, make_executor(cfg, spec, parts, None), slots, device)
    return parts


def build_engine(cfg, spec, requests, parts: EngineParts | None = None):
    """The driver, scheduler and run info of an engine run; parts: a model already built
    (same model and engine settings) to run on instead of building one."""
    e = cfg.engine
    if e.tp != 1:
        if parts is not None:
            raise ValueError("engine.tp > 1 builds its ranks per run; prebuilt engine parts are for tp=1")
        from testbed.engine.tp.launch import build_tp_engine
        return build_tp_engine(cfg, spec, requests)
    parts = parts or build_parts(cfg, spec)
    sched = make_scheduler(cfg, spec, parts.slots // e.page_size)
    executor = make_executor(cfg, spec, parts, sched)
    driver = RealtimeDriver(sched, executor, requests, overlap=e.overlap)
    return driver, sched, engine_info(cfg, sched, parts.device, parts.report, executor) | {"warmup_s": parts.warmup_s}


def warm_up_engine(cfg, spec, executor, slots: int, device) -> float | None:
    """engine.warmup: every kind of step once before the clock starts (testbed/engine/warmup.py);
    on the CPU, where nothing compiles, a few small steps only."""
    if not cfg.engine.warmup:
        return None
    from testbed.engine.warmup import warm_up
    p = cfg.policy
    return warm_up(executor, slots, cfg.engine.page_size, spec.vocab_size, max(p.max_prefill_tokens, p.token_budget),
                   p.max_running, quick=device.type != "cuda")


def create_pool(model, slots: int, page_size: int) -> None:
    """The KV pool: the scheduler's pages plus one scratch page (padding rows of CUDA
    graphs write there; the scheduler never hands it out)."""
    model.create_kv_pool(slots + page_size, page_size)


def make_graphs(cfg, model, device, num_pages: int, max_context: int):
    """Decode CUDA graphs, or None (CPU, or engine.cuda_graph_max_bs=0). Every TP rank
    captures the same sizes, so padded batches agree across ranks."""
    if device.type != "cuda" or cfg.engine.cuda_graph_max_bs <= 0:
        return None
    from testbed.engine.cuda_graphs import DecodeGraphs
    max_bs = min(cfg.engine.cuda_graph_max_bs, cfg.policy.max_running)
    return DecodeGraphs(model, device, max_bs, scratch_page=num_pages,
                        max_pages_per_req=-(-max_context // cfg.engine.page_size))


def eager_max_tokens(policy) -> int:
    """The most tokens a step outside the decode graphs can have under the policy's budgets."""
    return max(policy.max_prefill_tokens, policy.token_budget, policy.max_running)


def make_pieces(cfg, model, device, num_pages: int):
    """Piecewise CUDA graphs of the eager steps, or None (CPU, or engine.piecewise_graphs=false).
    Every TP rank captures the same sizes."""
    if device.type != "cuda" or not cfg.engine.piecewise_graphs:
        return None
    import time

    from testbed.engine.piecewise_graphs import PiecewiseGraphs
    t0 = time.perf_counter()
    pieces = PiecewiseGraphs(model, device, eager_max_tokens(cfg.policy), scratch_slot=num_pages * cfg.engine.page_size)
    log.info("piecewise CUDA graphs: %d sizes up to %d tokens, %d graphs in %.1f s", len(pieces.sizes),
             pieces.max_tokens, pieces.num_graphs, time.perf_counter() - t0)
    return pieces


def make_executor(cfg, spec, parts: EngineParts, sched) -> EngineExecutor:
    from testbed.sim.build import cost_model_for
    cost, _ = cost_model_for(cfg, spec)  # each step's prediction, beside its measurement
    return EngineExecutor(parts.model, parts.device, cfg.policy.max_running, sched, cost, parts.graphs, parts.pieces)


def engine_info(cfg, sched, device, report, executor) -> dict:
    e = cfg.engine
    return {"num_pages": sched.cfg.num_pages, "page_size": e.page_size, "device": str(device), "tp": e.tp,
            "attention": e.attention, "kernels": resolve_kernels(e.kernels, device), "weights": str(report), "cuda_graphs": executor.graphs is not None,
            "piecewise_graphs": executor.pieces is not None, "overlap": e.overlap, "cost_model": repr(executor.cost_model)}
