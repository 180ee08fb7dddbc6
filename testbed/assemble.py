"""The composition root: the one place a run is built from the resolved config, into typed
parts (model shape, trace and requests, scheduler, executor, driver). Below it nothing
reads the config: the simulator gets a cost model, the engine its EngineSettings, the
scheduler its SchedulerConfig and policy. Both backends share the model shape, requests
and scheduler built here, so a simulated and a real run of one config see the same ones."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies import config_like, eviction_key, make_policy
from testbed.config import resolved_overlap
from testbed.core import Request, SamplingParams
from testbed.core.made_on_read import MadeOnRead
from testbed.modelspec import ModelSpec, check_tp_split, model_spec_from_cfg, tp_split_problems
from testbed.scheduler import Scheduler, SchedulerConfig
from testbed.steploop import Driver, Executor
from testbed.traces import Trace, load_trace

# engine_parts shares one rank's model between runs; TP ranks are processes started per run
PREBUILT_TP = "engine.tp > 1 builds its ranks per run; prebuilt engine parts are for tp=1"


@dataclass
class Run:
    spec: ModelSpec
    trace: Trace | None  # None: a server's run, fed by messages (testbed.serve)
    requests: Sequence[Request]  # a replay's: TraceRequests, made as they arrive
    scheduler: Scheduler
    driver: Driver
    info: dict  # the run's KV pool and backend, for summary.json

    @property
    def executor(self) -> Executor:
        return self.driver.executor


def build_run(cfg, engine_parts=None) -> Run:
    """engine_parts: a model already built for this config's engine settings (engine_parts()),
    shared by several runs."""
    spec = model_spec(cfg)
    trace = trace_for(cfg, spec)
    requests = requests_from(trace, spec, cfg.engine)
    if cfg.backend.name == "sim":
        if engine_parts is not None:
            raise ValueError("engine parts are for backend=engine")
        sched, driver, info = _sim_backend(cfg, spec, requests)
    else:
        sched, driver, info = _engine_backend(cfg, spec, requests, engine_parts)
    return Run(spec, trace, requests, sched, driver, info)


@dataclass
class ClientRun:
    """backend=http: the trace's requests sent to a server; no scheduler or executor of ours."""
    spec: ModelSpec
    trace: Trace
    driver: "HttpDriver"  # noqa: F821 (testbed.client; its records: one per trace request)
    info: dict  # the server and how it was driven, for summary.json


def build_client_run(cfg) -> ClientRun:
    """The trace (its token ids within the vocabulary and context of the model config, which
    should be the server's) as request bodies for the server at backend.url."""
    from testbed.client import ClientRecord, HttpDriver
    from testbed.client.prompts import PATHS, load_decoder, request_body
    b = cfg.backend
    spec = model_spec(cfg)
    trace = trace_for(cfg, spec)
    model = b.model or server_model(b.url)
    decode = load_decoder(b.tokenizer) if b.prompt == "text" else None
    e = cfg.engine
    records, bodies = [], []
    for t in trace.requests:
        rec = ClientRecord(t.rid, t.prompt_len, t.output_len, t.arrival_s, t.priority)
        records.append(rec)
        if t.prompt_ids is None:  # over the context (trace.over_context=reject): its ids were never made
            rec.state, rec.finish_reason = "REJECTED", "rejected"
            rec.reject_reason = f"prompt of {t.prompt_len} tokens over the context of {spec.name} ({spec.max_context})"
            bodies.append(None)
            continue
        prompt = decode(t.prompt_ids) if decode else [int(i) for i in t.prompt_ids]
        sampling = SamplingParams(e.temperature, e.top_k, e.top_p, seed=t.rid)
        bodies.append(request_body(b.api, model, prompt, t.output_len, sampling, b.ignore_eos))
    url = b.url.rstrip("/") + PATHS[b.api]
    driver = HttpDriver(url, records, bodies, b.max_concurrency, b.timeout_s)
    info = {"url": url, "model": model, "api": b.api, "prompt": b.prompt, "max_concurrency": b.max_concurrency,
            "ignore_eos": b.ignore_eos}
    return ClientRun(spec, trace, driver, info)


def server_model(url: str) -> str:
    """The first model a server's /v1/models lists (what a request names when backend.model is null)."""
    import httpx
    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", timeout=30)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except httpx.HTTPError as e:
        raise ValueError(f"backend.url={url!r}: its /v1/models did not answer ({type(e).__name__}: {e}); "
                         f"is the server up? (or give backend.model=NAME)") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"backend.url={url!r}: its /v1/models lists no model; give backend.model=NAME") from None


def build_server_run(cfg, spec: ModelSpec, feed, driver_class) -> Run:
    """The engine fed by a server's messages instead of a trace (testbed.serve): the same
    scheduler and executor as a replay, a driver of driver_class over the feed."""
    sched, driver, info = _engine_backend(cfg, spec, (), None, driver_class, feed)
    return Run(spec, None, feed.requests, sched, driver, info)


def model_spec(cfg) -> ModelSpec:
    """The shape from model.path's config.json when a model directory is given, else
    model.config_path; its context narrowed to trace.max_context when that is set (a deployment
    with a shorter context, as vLLM's --max-model-len: the trace, the scheduler and the engine
    all hold to it)."""
    m = cfg.model
    if m.path:
        m = dataclasses.replace(m, config_path=m.path)
    spec = model_spec_from_cfg(m)
    ctx = getattr(getattr(cfg, "trace", None), "max_context", None)
    if ctx is None:
        return spec
    if isinstance(ctx, bool) or not isinstance(ctx, int) or not 2 <= ctx <= spec.max_context:
        raise ValueError(f"trace.max_context={ctx} is invalid; allowed: 2..{spec.max_context} "
                         f"(the context of {spec.name}), or null for the model's")
    return dataclasses.replace(spec, max_context=ctx)


def trace_for(cfg, spec: ModelSpec) -> Trace:
    """Load the trace with the run's context (model_spec's), and the model's vocabulary unless
    trace.vocab_size narrows it (ids always stay valid for the engine)."""
    vocab = spec.vocab_size
    if cfg.trace.vocab_size is not None:
        if not 2 <= cfg.trace.vocab_size <= spec.vocab_size:
            raise ValueError(f"trace.vocab_size={cfg.trace.vocab_size} is invalid; allowed: 2..{spec.vocab_size} "
                             f"(the vocabulary of {spec.name})")
        vocab = cfg.trace.vocab_size
    tcfg = dataclasses.replace(cfg.trace, max_context=spec.max_context, vocab_size=vocab)
    return load_trace(tcfg)


def requests_from(trace: Trace, spec: ModelSpec, engine_cfg) -> TraceRequests:
    return TraceRequests(trace, spec, engine_cfg)


class TraceRequests(MadeOnRead):
    """A trace's requests as the scheduler's Requests, in the trace's order (its rids, which
    is arrival order), each made when first read: a replay reads one as it arrives
    (steploop.TraceFeed), so a 100,000-request trace does not build every ledger before its
    first step. A non-lazy row's ids move to its Request (the row drops them: the run's
    writer drops the Request's once it is done, and nothing else holds them)."""

    def __init__(self, trace: Trace, spec: ModelSpec, engine_cfg):
        self._rows = rows = trace.requests
        #: in (arrival, rid) order, as the trace loaders leave them: TraceFeed takes it as it is
        #: (sorting it would make every Request up front). A loader's TraceRequestList has its
        #: arrivals as a column (its rids ascend), read without making its rows.
        col = getattr(rows, "arrival_s", None)
        self.in_arrival_order = (bool((np.diff(col) >= 0).all()) if col is not None else
                                 all((a.arrival_s, a.rid) <= (b.arrival_s, b.rid) for a, b in zip(rows, rows[1:])))
        super().__init__(len(rows))
        self._eos, self._max_context, self._ignore_eos = tuple(spec.eos_token_ids), spec.max_context, engine_cfg.ignore_eos
        self._sampling = (engine_cfg.temperature, engine_cfg.top_k, engine_cfg.top_p)
        SamplingParams(*self._sampling)  # a bad setting fails here, before the run, not at the first arrival

    def _make(self, i: int) -> Request:
        t = self._rows[i]
        lazy = t.id_source  # the ids are made as the request arrives (TraceFeed), not all up front
        ids = None if lazy is not None else t.prompt_ids
        if ids is None and lazy is None and t.prompt_len + t.output_len <= self._max_context:
            raise AssertionError(f"trace request {t.rid} has no token ids but fits the context {self._max_context}")
        if lazy is None:
            t.prompt_ids = None
        return Request(rid=t.rid, prompt_len=t.prompt_len, max_new_tokens=t.output_len, arrival=t.arrival_s,
                       prompt_ids=ids, ignore_eos=self._ignore_eos, eos_token_ids=self._eos, priority=t.priority,
                       sampling=SamplingParams(*self._sampling, seed=t.rid), ids_source=lazy)


def make_scheduler(cfg, spec: ModelSpec, num_pages: int) -> Scheduler:
    policy = make_policy(cfg.policy)
    scfg = SchedulerConfig(num_pages=num_pages, page_size=cfg.engine.page_size, max_context=spec.max_context,
                           cache=cfg.cache.name, eviction=cfg.eviction.name, check_every_step=cfg.check_every_step,
                           limits=cfg.scheduler)
    return Scheduler(scfg, policy, eviction_key(cfg.eviction.name))


def scheduler_per_policy(cfg, spec: ModelSpec):
    """(policy name, num_pages) -> a scheduler of this config with that policy (the profiler
    times each policy's host cost on one engine): the config's policy as it is; another with
    the knobs every policy has from it, its own at their defaults, its step budget cut to
    what a step of this deployment holds (scheduler.max_step_tokens)."""
    def make(name: str, num_pages: int) -> Scheduler:
        policy = config_like(cfg.policy, name)
        if policy is not cfg.policy and policy.step_budget_key is not None:
            setattr(policy, policy.step_budget_key, min(policy.step_budget(), cfg.scheduler.max_step_tokens))
        return make_scheduler(dataclasses.replace(cfg, policy=policy), spec, num_pages)
    return make


def cost_model(cfg, spec: ModelSpec):
    """The deployment's cost model and hardware: the simulator's step times, the engine's
    predictions beside its measurements."""
    from testbed.sim.costmodel import make_cost_model
    from testbed.sim.costmodel.hardware import load_hardware
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


def profile_cost_model(profile, model: str, hardware: str):
    """The calibrated cost model of one profile file for a model on a GPU (dummy weights): what
    the scripts that price measured batches by a profile read."""
    from testbed.config import compose
    cfg = compose([f"model={model}", f"hardware={hardware}", "model.weights=dummy", "costmodel=calibrated",
                   f"costmodel.profile={Path(profile).resolve()}"])
    return cost_model(cfg, model_spec(cfg))[0]


def sim_kv_pages(cfg, spec: ModelSpec, hardware) -> int:
    """KV pages a deployment would have: memory left after weights, per TP rank."""
    e = cfg.engine
    if e.num_pages is not None:
        return e.num_pages
    tp = e.tp
    per_token = spec.kv_bytes_per_token(tp)
    free = hardware.mem_bytes * e.mem_fraction - spec.weight_bytes() / tp
    if free <= 0:
        budget = hardware.mem_bytes * e.mem_fraction
        fits = [t for t in (2, 4, 8, 16, 32, 64) if t > tp and spec.weight_bytes() / t < budget
                and not tp_split_problems(spec, t)]
        hint = (f"; engine.tp={fits[0]} would fit it ({spec.weight_bytes() / fits[0] / 1e9:.1f} GB of weights a GPU)"
                if fits else "")
        raise ValueError(f"model {spec.name} ({spec.weight_bytes() / 1e9:.1f} GB of weights over tp={tp}) does "
                         f"not fit {hardware.name} ({hardware.mem_bytes / 1e9:.0f} GB x mem_fraction {e.mem_fraction})"
                         + hint)
    pages = int(free // (per_token * e.page_size))
    if pages < 1:
        raise ValueError(f"model {spec.name} leaves {free / 1e6:.1f} MB of {hardware.name}'s memory x mem_fraction "
                         f"{e.mem_fraction} for the KV cache, less than one page ({per_token * e.page_size} bytes); "
                         f"raise engine.mem_fraction or set engine.num_pages")
    return pages


def _sim_backend(cfg, spec: ModelSpec, requests):
    import simpy

    from testbed.sim.driver import SimDriver
    from testbed.sim.executor import SimExecutor
    cost, hw = cost_model(cfg, spec)
    pages = sim_kv_pages(cfg, spec, hw)
    sched = make_scheduler(cfg, spec, pages)
    env = simpy.Environment()
    driver = SimDriver(sched, SimExecutor(cost, lambda: env.now), requests, overlap=resolved_overlap(cfg), env=env,
                       fast_path=cfg.backend.fast_path)
    return sched, driver, {"num_pages": pages, "page_size": cfg.engine.page_size, "cost_model": repr(cost),
                           "overlap": resolved_overlap(cfg)}


def engine_settings(cfg, spec: ModelSpec):
    """What the engine needs of the config (testbed/engine/settings.py; imports torch)."""
    from testbed.engine.settings import EngineSettings
    e, m, lim = cfg.engine, cfg.model, cfg.scheduler
    if m.weights == "real" and not m.path:
        raise ValueError("model.weights=real needs model.path=DIR (config.json + *.safetensors); "
                         "or use model.weights=dummy")
    return EngineSettings(
        device=e.device, attention=e.resolved_attention(), kernels=e.kernels, dtype=e.dtype,
        decode_tensor_cores=e.decode_tensor_cores, prefill_backend=e.prefill_backend,
        weights="dummy" if m.weights == "dummy" else m.path, seed=cfg.seed, page_size=e.page_size,
        num_pages=e.num_pages, mem_fraction=e.mem_fraction, cuda_graph_max_bs=e.cuda_graph_max_bs,
        piecewise_graphs=e.piecewise_graphs, whole_step_graphs=e.whole_step_graphs, warmup=e.warmup,
        overlap=resolved_overlap(cfg),
        max_running=lim.max_running, max_step_tokens=lim.max_step_tokens, tp=e.tp, debug_plan_hash=e.debug_plan_hash,
        cpu_threads=e.cpu_threads)


def engine_parts(cfg):
    """One rank's engine (tp=1), warmed up, for several runs of this model and engine settings."""
    from testbed.engine.build import build_warm_parts
    if cfg.engine.tp != 1:
        raise ValueError(PREBUILT_TP)
    spec = model_spec(cfg)
    return build_warm_parts(engine_settings(cfg, spec), spec)


def _engine_backend(cfg, spec: ModelSpec, requests, parts, driver_class=None, feed=None):
    from testbed.engine.build import build_parts, build_warm_parts, warm_up_engine
    from testbed.engine.driver import RealtimeDriver
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.kernels import resolve_kernels
    s = engine_settings(cfg, spec)
    cost, _ = cost_model(cfg, spec)  # each step's prediction, beside its measurement

    def executor_over(parts, sched):
        return EngineExecutor(parts.model, parts.device, s.max_running, sched, cost, parts.graphs, parts.pieces)
    if s.tp == 1:
        parts = parts or build_warm_parts(s, spec)
        sched = make_scheduler(cfg, spec, parts.slots // s.page_size)
        executor = executor_over(parts, sched)
    else:
        if parts is not None:
            raise ValueError(PREBUILT_TP)
        from testbed.engine.tp.executor import TPExecutor
        from testbed.engine.tp.launch import start_ranks
        ranks = start_ranks(s, spec)
        with ranks.stopped_on_error():
            parts = build_parts(s, spec, ranks.tp)
            sched = make_scheduler(cfg, spec, parts.slots // s.page_size)
            executor = TPExecutor(executor_over(parts, sched), ranks, s.debug_plan_hash)
            parts.warmup_s = warm_up_engine(s, spec, executor, parts)  # every rank runs the same warm-up steps
        ranks.supervisor.started()
    driver = (driver_class or RealtimeDriver)(sched, executor, requests, overlap=s.overlap, feed=feed)
    info = {"num_pages": sched.cfg.num_pages, "page_size": s.page_size, "device": str(parts.device), "tp": s.tp,
            "attention": s.attention, "kernels": resolve_kernels(s.kernels, parts.device), "weights": str(parts.report),
            "cuda_graphs": executor.graphs is not None, "piecewise_graphs": executor.pieces is not None,
            "overlap": s.overlap, "cost_model": repr(cost), "warmup_s": parts.warmup_s}
    if parts.device.type == "cpu":  # this (first) rank's intra-op threads: engine.cpu_threads, or the default
        import torch
        info["cpu_threads"] = torch.get_num_threads()
    return sched, driver, info
