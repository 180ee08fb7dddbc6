"""Build a run's parts from the resolved config: model shape, requests, scheduler.
Shared by both backends, so a simulated and a real run of one config see the same
requests and the same scheduler."""
from __future__ import annotations

import dataclasses

from policies import eviction_key, make_policy
from testbed.core import Request, SamplingParams
from testbed.modelspec import ModelSpec, model_spec_from_cfg
from testbed.scheduler import Scheduler, SchedulerConfig
from testbed.traces import Trace, load_trace


def model_spec(cfg) -> ModelSpec:
    """The shape from model.path's config.json when a model directory is given, else model.config_path."""
    m = cfg.model
    if m.path:
        m = dataclasses.replace(m, config_path=m.path)
    return model_spec_from_cfg(m)


def trace_for(cfg, spec: ModelSpec) -> Trace:
    """Load the trace with the model's context, and its vocabulary unless trace.vocab_size
    narrows it (ids always stay valid for the engine)."""
    vocab = spec.vocab_size
    if cfg.trace.vocab_size is not None:
        if not 2 <= cfg.trace.vocab_size <= spec.vocab_size:
            raise ValueError(f"trace.vocab_size={cfg.trace.vocab_size} is invalid; allowed: 2..{spec.vocab_size} "
                             f"(the vocabulary of {spec.name})")
        vocab = cfg.trace.vocab_size
    tcfg = dataclasses.replace(cfg.trace, max_context=spec.max_context, vocab_size=vocab)
    return load_trace(tcfg)


def requests_from(trace: Trace, spec: ModelSpec, engine_cfg) -> list[Request]:
    eos = tuple(spec.eos_token_ids)
    out = []
    for t in trace.requests:
        if t.prompt_ids is None and t.prompt_len + t.output_len <= spec.max_context:
            raise AssertionError(f"trace request {t.rid} has no token ids but fits the context {spec.max_context}")
        sampling = SamplingParams(engine_cfg.temperature, engine_cfg.top_k, engine_cfg.top_p, seed=t.rid)
        out.append(Request(rid=t.rid, prompt_len=t.prompt_len, max_new_tokens=t.output_len,
                           arrival=t.arrival_s, prompt_ids=t.prompt_ids, ignore_eos=engine_cfg.ignore_eos,
                           eos_token_ids=eos, priority=t.priority, sampling=sampling))
    return out


def sim_kv_pages(cfg, spec: ModelSpec, hardware) -> int:
    """KV pages a deployment would have: memory left after weights, per TP rank."""
    e = cfg.engine
    if e.num_pages is not None:
        return e.num_pages
    tp = e.tp
    per_token = spec.kv_bytes_per_token(tp)
    free = hardware.mem_bytes * e.mem_fraction - spec.weight_bytes() / tp
    if free <= 0:
        raise ValueError(f"model {spec.name} ({spec.weight_bytes() / 1e9:.1f} GB of weights over tp={tp}) does "
                         f"not fit {hardware.name} ({hardware.mem_bytes / 1e9:.0f} GB x mem_fraction {e.mem_fraction})")
    pages = int(free // (per_token * e.page_size))
    if pages < 1:
        raise ValueError(f"model {spec.name} leaves {free / 1e6:.1f} MB of {hardware.name}'s memory x mem_fraction "
                         f"{e.mem_fraction} for the KV cache, less than one page ({per_token * e.page_size} bytes); "
                         f"raise engine.mem_fraction or set engine.num_pages")
    return pages


def make_scheduler(cfg, spec: ModelSpec, num_pages: int) -> Scheduler:
    policy = make_policy(cfg.policy)
    scfg = SchedulerConfig(num_pages=num_pages, page_size=cfg.engine.page_size, max_context=spec.max_context,
                           cache=cfg.cache.name, eviction=cfg.eviction.name, check_every_step=cfg.check_every_step)
    return Scheduler(scfg, policy, eviction_key(cfg.eviction.name))
