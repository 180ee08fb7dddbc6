"""The engine's parts from its settings (testbed/engine/settings.py): this rank's model
shard and weights on the device, a KV pool sized from free memory (or the fixed page
count), the decode and piecewise CUDA graphs, and the warm-up. Reads no config: the
composition root (testbed/assemble.py) hands it the settings."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from testbed.engine.executor import EngineExecutor
from testbed.engine.model import build_model, load_weights
from testbed.engine.settings import EngineSettings

log = logging.getLogger(__name__)
HEADROOM_BYTES = 4 << 30  # activations, logits and CUDA graphs beside the KV pool
CPU_DEFAULT_SLOTS = 32768


@dataclass
class EngineParts:
    """What a run's engine is built from and several runs of one model can share (the
    fidelity experiment replays many cells on one model load): model with its KV pool,
    CUDA graphs, the warm-up already done (tp=1)."""
    device: torch.device
    model: object
    slots: int
    graphs: object
    pieces: object
    report: object  # what the weights were loaded from
    warmup_s: float | None = None


def engine_device(s: EngineSettings, rank: int = 0) -> torch.device:
    if s.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("engine.device=cuda but no CUDA device is visible; "
                             "use engine.device=cpu engine.attention=torch")
        return torch.device("cuda", rank)
    if s.device != "cpu":
        raise ValueError(f"engine.device={s.device!r} is invalid; allowed: cuda, cpu")
    if s.attention != "torch":
        raise ValueError(f"engine.attention={s.attention!r} needs a GPU; on engine.device=cpu use engine.attention=torch")
    return torch.device("cpu")


def kv_slots(s: EngineSettings, model, device: torch.device) -> int:
    if s.num_pages is not None:
        return s.num_pages * s.page_size
    per_slot = model.kv_bytes_per_slot()
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = total * s.mem_fraction - (total - free) - HEADROOM_BYTES
        if budget <= per_slot * s.page_size:
            raise ValueError(f"no GPU memory left for the KV cache: {free / 2**30:.1f} GiB free of "
                             f"{total / 2**30:.1f} GiB after the weights; raise engine.mem_fraction or set engine.num_pages")
        return int(budget // (per_slot * s.page_size)) * s.page_size
    slots = max(CPU_DEFAULT_SLOTS // s.page_size, 1) * s.page_size  # whole pages, whatever the page size
    log.info("engine on the CPU without engine.num_pages: KV pool of %d slots", slots)
    return slots


def load_shard(s: EngineSettings, spec, device: torch.device, tp=None):
    """This rank's shard of the model of shape `spec` (every rank builds from rank 0's spec)
    with its weights; tp: the rank's TPGroup, or None for one rank."""
    torch.manual_seed(s.seed)
    options = {}
    if s.decode_tensor_cores is not None:
        if s.attention != "flashinfer":
            raise ValueError(f"engine.decode_tensor_cores is a flashinfer option; engine.attention is {s.attention!r}")
        options["decode_use_tensor_cores"] = s.decode_tensor_cores
    if s.prefill_backend != "fa2":
        if s.attention != "flashinfer":
            raise ValueError(f"engine.prefill_backend is a flashinfer option; engine.attention is {s.attention!r}")
        options["prefill_backend"] = s.prefill_backend
    rank, world, group = (tp.rank, tp.world, tp.group) if tp is not None else (0, 1, None)
    model = build_model(spec, s.dtype, device, s.attention, rank, world, group, s.kernels, options)
    report = load_weights(model, s.weights, seed=s.seed)
    log.info("rank %d weights: %s", rank, report)
    return model, report


def build_parts(s: EngineSettings, spec, tp=None) -> EngineParts:
    """This rank's parts, not warmed up; tp: the rank's TPGroup (the ranks agree on the
    smallest KV pool), or None for one rank."""
    device = engine_device(s, tp.rank if tp is not None else 0)
    if tp is None and device.type == "cpu" and s.cpu_threads:  # TP ranks set theirs when they start
        torch.set_num_threads(s.cpu_threads)
    model, report = load_shard(s, spec, device, tp)
    slots = kv_slots(s, model, device)
    if tp is not None:
        from testbed.engine.tp.group import agree_kv_slots
        slots = agree_kv_slots(slots, tp)
    create_pool(model, slots, s.page_size)
    num_pages = slots // s.page_size
    graphs = make_graphs(s, model, device, num_pages, spec.max_context)
    pieces = make_pieces(s, model, device, num_pages, spec.max_context)
    return EngineParts(device, model, slots, graphs, pieces, report)


def build_warm_parts(s: EngineSettings, spec) -> EngineParts:
    """One rank's parts, warmed up on an executor of their own (runs sharing them start warm)."""
    parts = build_parts(s, spec)
    bare = EngineExecutor(parts.model, parts.device, s.max_running, graphs=parts.graphs, pieces=parts.pieces)
    parts.warmup_s = warm_up_engine(s, spec, bare, parts)
    return parts


def warm_up_engine(s: EngineSettings, spec, executor, parts: EngineParts) -> float | None:
    """engine.warmup: every kind of step once before the clock starts (testbed/engine/warmup.py);
    on the CPU, where nothing compiles, a few small steps only."""
    if not s.warmup:
        return None
    from testbed.engine.warmup import warm_up
    return warm_up(executor, parts.slots, s.page_size, spec.vocab_size, s.max_step_tokens, s.max_running,
                   quick=parts.device.type != "cuda")


def create_pool(model, slots: int, page_size: int) -> None:
    """The KV pool: the scheduler's pages plus one scratch page (padding rows of CUDA
    graphs write there; the scheduler never hands it out)."""
    model.create_kv_pool(slots + page_size, page_size)


def make_graphs(s: EngineSettings, model, device, num_pages: int, max_context: int):
    """Decode CUDA graphs, or None (CPU, or engine.cuda_graph_max_bs=0). Every TP rank
    captures the same sizes, so padded batches agree across ranks."""
    if device.type != "cuda" or s.cuda_graph_max_bs <= 0:
        return None
    from testbed.engine.cuda_graphs import DecodeGraphs
    max_bs = min(s.cuda_graph_max_bs, s.max_running)
    return DecodeGraphs(model, device, max_bs, scratch_page=num_pages,
                        max_pages_per_req=-(-max_context // s.page_size))


def make_pieces(s: EngineSettings, model, device, num_pages: int, max_context: int):
    """Piecewise CUDA graphs of the eager steps, or None (CPU, or engine.piecewise_graphs=false),
    with eager steps of a few requests captured whole (engine.whole_step_graphs). Every TP rank captures
    the same sizes."""
    if device.type != "cuda" or not s.piecewise_graphs:
        return None
    from testbed.engine.piecewise_graphs import PiecewiseGraphs
    t0 = time.perf_counter()
    pieces = PiecewiseGraphs(model, device, s.max_step_tokens, scratch_slot=num_pages * s.page_size)
    log.info("piecewise CUDA graphs: %d sizes up to %d tokens, %d graphs in %.1f s", len(pieces.sizes),
             pieces.max_tokens, pieces.num_graphs, time.perf_counter() - t0)
    if s.whole_step_graphs:
        from testbed.engine.whole_graphs import WholeStepGraphs
        t0 = time.perf_counter()
        pieces.whole = WholeStepGraphs(pieces, max_context)
        log.info("whole-step CUDA graphs: %d up to %d tokens in %.1f s", pieces.whole.num_graphs,
                 pieces.whole.max_tokens, time.perf_counter() - t0)
    return pieces
