"""Structured configs (the Hydra schema) and their checks. A bad value fails at start
with one line naming the key, the value and what is allowed."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from policies import EVICTIONS, POLICIES, PolicyConfig, own_knobs
from testbed.engine.attention import ATTENTION_BACKENDS  # the names only: no torch
from testbed.engine.kernels import check_kernels  # the names only: no torch
from testbed.engine.options import PREFILL_BACKENDS
from testbed.kv import PREFIX_CACHES
from testbed.modelspec import ModelConfig
from testbed.scheduler.config import SchedulerLimits
from testbed.sim.costmodel.base import COST_MODELS
from testbed.traces import TRACES, TraceConfig

BACKENDS = ("sim", "engine", "http")
HTTP_APIS = ("completions", "chat")
HTTP_PROMPTS = ("ids", "text")
DTYPES = ("bfloat16", "float16", "float32")


class ConfigError(ValueError):
    pass


# settings that moved: an old script's override names the new key instead of failing vaguely
MOVED = {"policy.max_running": "scheduler.max_running"}
# a knob some policies keep that also sized the engine's steps before the limits left the policy
SIZED_STEPS = {"policy.max_prefill_tokens": "scheduler.max_step_tokens"}


def _bad(key, value, allowed):
    raise ConfigError(f"{key}={value!r} is invalid; allowed: {allowed}")


@dataclass
class BackendConfig:
    name: str = "sim"  # sim: the SimPy simulator and a cost model; engine: the real engine; http: a server's client


@dataclass
class SimBackendConfig(BackendConfig):
    """backend=sim: the SimPy simulator."""
    name: str = "sim"
    # run steady stretches of decode steps at once (testbed/sim/fastpath.py): the same files,
    # byte for byte, in less time; false steps one by one (as check_every_step does, to check each)
    fast_path: bool = True


@dataclass
class HttpBackendConfig(BackendConfig):
    """backend=http: replay the trace against an OpenAI-compatible server (testbed/client)."""
    name: str = "http"
    url: Optional[str] = None  # the server, http://HOST:PORT (the API's paths are added: /v1/completions)
    model: Optional[str] = None  # the model name requests give; null: the first of the server's /v1/models
    api: str = "completions"  # completions (/v1/completions) | chat (/v1/chat/completions: text prompts)
    prompt: str = "ids"  # ids: the trace's token ids as the prompt (completions only) | text: decoded by tokenizer
    tokenizer: Optional[str] = None  # prompt=text: a tokenizer.json (or the folder holding one) to decode the ids
    max_concurrency: Optional[int] = None  # requests in flight at most (the rest wait for a slot); null: no cap
    ignore_eos: bool = True  # send ignore_eos and min_tokens = max_tokens (the trace's output length exactly)
    timeout_s: float = 600.0  # a request fails when the server sends nothing for this long (connect, read)

    def validate(self) -> None:
        if not self.url or not str(self.url).startswith(("http://", "https://")):
            _bad("backend.url", self.url, "the server's address, http://HOST:PORT")
        if self.api not in HTTP_APIS:
            _bad("backend.api", self.api, ", ".join(HTTP_APIS))
        if self.prompt not in HTTP_PROMPTS:
            _bad("backend.prompt", self.prompt, ", ".join(HTTP_PROMPTS))
        if self.api == "chat" and self.prompt == "ids":
            _bad("backend.prompt", self.prompt, "text with backend.api=chat (a chat message is text)")
        if self.prompt == "text" and not self.tokenizer:
            _bad("backend.tokenizer", self.tokenizer, "a tokenizer.json or its folder, to turn the trace's ids "
                 "into text (backend.prompt=text)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            _bad("backend.max_concurrency", self.max_concurrency, "null (no cap) or an integer >= 1")
        if not self.timeout_s > 0:
            _bad("backend.timeout_s", self.timeout_s, "a number of seconds > 0")


@dataclass
class NamedConfig:
    name: str = ""  # the registered part (an eviction order, a prefix cache) by its name


@dataclass
class EngineConfig:
    """The deployment both backends describe: the simulator sizes its KV pool and cost
    model from it exactly as the engine does."""
    tp: int = 1  # tensor-parallel degree: GPUs (or CPU processes) one model is split over
    page_size: int = 1  # KV slots a page holds (the allocator's and the radix cache's unit)
    mem_fraction: float = 0.9  # of device memory for weights + KV pool
    num_pages: Optional[int] = None  # fixed KV pool size; None: from memory
    device: str = "cuda"  # cuda | cpu (the engine's torch reference path)
    attention: Optional[str] = None  # flashinfer | torch; null: flashinfer on CUDA, torch on a CPU
    kernels: str = "auto"  # elementwise ops: triton | torch | auto (triton on CUDA, torch on the CPU)
    # flashinfer decode through its tensor-core (prefill) kernel; null: when q heads / kv heads >= 4
    decode_tensor_cores: Optional[bool] = None
    prefill_backend: str = "fa2"  # flashinfer prefill kernel template: fa2 | fa3 (Hopper)
    dtype: str = "bfloat16"  # weights and activations: bfloat16 | float16 | float32
    # None: on, except for the engine on a CPU (there every op runs as it is enqueued, and
    # overlapped steps ran several times slower on a 2-core machine)
    overlap: Optional[bool] = None
    cuda_graph_max_bs: int = 256  # decode CUDA graphs up to this batch; 0 disables them
    # CUDA graphs for the other steps (prefill, mixed, decode beyond the graphs), in pieces
    # between the attention calls, for token counts up to scheduler.max_step_tokens
    piecewise_graphs: bool = True
    # eager steps of up to 1,024 tokens and 1-3 requests as one CUDA graph each, attention and LM
    # head included, where the graph's attention plan picks the eager plan's query tile
    # (testbed/engine/whole_graphs.py): their launch 0.3-1.1 ms instead of 1.1-2.5 ms on the H200,
    # their device time 0-3% longer; needs the piecewise graphs, flashinfer and page size 1.
    # Off: the committed profiles and fidelity runs were measured without it
    whole_step_graphs: bool = False
    warmup: bool = True  # run every kind of step once before the first arrival (GPU: compile outside the clock)
    ignore_eos: bool = True  # generate every request's output length from the trace, past EOS
    temperature: float = 0.0  # sampling of every request; 0: greedy
    top_k: int = -1  # sampling: keep the k likeliest tokens; -1: off
    top_p: float = 1.0  # sampling: keep the smallest set of tokens with this probability mass; 1: off
    debug_plan_hash: bool = False  # TP: compare a hash of every plan across ranks
    # an engine on the CPU: torch's threads per TP rank; null: the cores over the ranks. Where other
    # work shares the cores (a server's own processes, other jobs) 1 keeps OpenMP's threads from
    # waiting on each other: SmolLM2-135M's decode took 685 ms a token with 2 threads on a loaded
    # 2-core machine, 134 ms with 1
    cpu_threads: Optional[int] = None

    @property
    def on_cpu(self) -> bool:
        return str(self.device).startswith("cpu")

    def resolved_attention(self) -> str:
        """engine.attention, its null resolved by the device."""
        return self.attention or ("torch" if self.on_cpu else "flashinfer")

    def validate(self) -> None:
        if self.tp < 1:
            _bad("engine.tp", self.tp, "an integer >= 1")
        if self.page_size < 1:
            _bad("engine.page_size", self.page_size, "an integer >= 1")
        if not (0.0 < self.mem_fraction <= 1.0):
            _bad("engine.mem_fraction", self.mem_fraction, "a number in (0, 1]")
        if self.dtype not in DTYPES:
            _bad("engine.dtype", self.dtype, ", ".join(DTYPES))
        if self.cuda_graph_max_bs < 0:
            _bad("engine.cuda_graph_max_bs", self.cuda_graph_max_bs, "0 (no decode graphs) or an integer >= 1")
        if self.num_pages is not None and self.num_pages < 1:
            _bad("engine.num_pages", self.num_pages, "null (size from memory) or an integer >= 1")
        if self.attention is not None:
            ATTENTION_BACKENDS.check(self.attention)
        check_kernels(self.kernels)
        if self.prefill_backend not in PREFILL_BACKENDS:
            _bad("engine.prefill_backend", self.prefill_backend, ", ".join(PREFILL_BACKENDS))
        if self.whole_step_graphs and not (self.piecewise_graphs and self.page_size == 1
                                              and self.resolved_attention() == "flashinfer"):
            raise ValueError("engine.whole_step_graphs=true needs engine.piecewise_graphs=true, "
                             f"engine.page_size=1 and engine.attention=flashinfer (got {self.piecewise_graphs}, "
                             f"{self.page_size}, {self.resolved_attention()})")
        if self.cpu_threads is not None and not (isinstance(self.cpu_threads, int) and self.cpu_threads >= 1):
            _bad("engine.cpu_threads", self.cpu_threads, "null (the cores over the TP ranks) or an integer >= 1")


@dataclass
class SLOConfig:
    ttft_ms: Optional[float] = None  # a request meets the SLO with a TTFT at most this; null: no TTFT SLO
    tpot_ms: Optional[float] = None  # ... and a TPOT at most this; null: no TPOT SLO
    e2e_ms: Optional[float] = None  # ... and an end-to-end latency at most this (goodput counts those meeting all given)

    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def validate(self) -> None:
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, key)
            if v is not None and not is_slo_ms(v):
                _bad(f"slo.{key}", v, "null (no SLO) or a number of milliseconds > 0")


def is_slo_ms(v) -> bool:
    """A usable SLO: a finite number of milliseconds > 0."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < float("inf")


@dataclass
class ServeConfig:
    """python -m testbed.serve: the HTTP server in front of the engine (testbed/serve)."""
    host: str = "127.0.0.1"  # address the HTTP server listens on (0.0.0.0: every interface)
    port: int = 30000  # HTTP port
    tokenizer_workers: int = 1  # tokenizer processes (requests go round robin)
    model_name: Optional[str] = None  # the name /v1/models lists and requests must give; null: model.name
    tokenizer: Optional[str] = None  # a directory with the tokenizer (and chat template); null: model.path
    # run the KV integrity check each time the scheduler goes idle (/metrics: testbed_kv_idle_check_*;
    # a failure makes /health 503); off: it sorts every page id of the pool, and a request arriving meanwhile waits
    idle_kv_check: bool = False

    def validate(self) -> None:
        if not (1 <= self.port <= 65535):
            _bad("serve.port", self.port, "an integer in 1..65535")
        if self.tokenizer_workers < 1:
            _bad("serve.tokenizer_workers", self.tokenizer_workers, "an integer >= 1")


@dataclass
class Config:
    backend: BackendConfig = field(default_factory=BackendConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the chosen policy's own Config subclass
    eviction: NamedConfig = field(default_factory=lambda: NamedConfig("lru"))
    cache: NamedConfig = field(default_factory=lambda: NamedConfig("radix"))
    trace: TraceConfig = field(default_factory=TraceConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("llama3_8b", "hf/llama3_8b.json"))
    hardware: Any = None  # conf/hardware/*.yaml, checked by load_hardware
    costmodel: Any = None  # conf/costmodel/*.yaml, checked by make_cost_model
    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerLimits = field(default_factory=SchedulerLimits)
    slo: SLOConfig = field(default_factory=SLOConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    seed: int = 0  # every random draw of the run (arrivals, token ids, sampling) derives from it
    progress: bool = True  # a progress bar on stderr (off in a multirun's jobs unless given)
    check_every_step: bool = False  # KV integrity check after every step (slow; debugging)


SWEPT_ENV = "TESTBED_SWEPT_KEYS"  # the keys a multirun's command line sweeps, for its job directories' names


def note_swept_keys(argv: list[str]) -> None:
    """Remember which keys the command line sweeps (a,b,c / range / choice), for swept_dirname
    in the jobs (launcher processes inherit the environment)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    try:
        keys = [o.get_key_element().lstrip("+~") for o in OverridesParser.create().parse_overrides(
            [a for a in argv if not a.startswith("-")]) if o.is_sweep_override()]
    except Exception:  # Hydra reports unparsable overrides itself
        return
    os.environ[SWEPT_ENV] = ",".join(keys)


def swept_dirname(override_dirname: str) -> str:
    """A job's override_dirname cut to the keys the sweep varies: those swept on the command line
    and the sweeper's own params (a +sweep=... config's, Optuna's search space). Everything
    when neither is known."""
    from hydra.core.hydra_config import HydraConfig
    keys = {k for k in os.environ.get(SWEPT_ENV, "").split(",") if k}
    try:
        params = HydraConfig.get().sweeper.get("params") or {}
        keys |= {str(k) for k in params}
    except ValueError:  # no Hydra config (composed by hand)
        pass
    if not keys:
        return override_dirname
    items = [i for i in override_dirname.split(",") if i.split("=", 1)[0].lstrip("+~") in keys]
    return ",".join(items) or override_dirname


_registered: dict = {}  # the registries' names the ConfigStore holds options for


def register_schema() -> None:
    """The schema, and one option of the groups policy, eviction and cache per registered name
    (a policy's option is its own config class), so `policy=<module>` works for a new module in
    policies/scheduling/ with no yaml file."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf
    if not OmegaConf.has_resolver("swept"):
        OmegaConf.register_new_resolver("swept", swept_dirname)
    names = (tuple(POLICIES.names()), tuple(EVICTIONS.names()), tuple(PREFIX_CACHES.names()))
    if _registered.get("names") == names:  # stored already (run, sweep and the precheck each ask): ~20 ms a time
        return
    _registered["names"] = names
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    store.store(group="schema/backend", name="http", node=HttpBackendConfig)  # conf/backend/http.yaml: its types
    store.store(group="schema/backend", name="sim", node=SimBackendConfig)
    for name in POLICIES.names():
        store.store(group="policy", name=name, node=POLICIES.get(name).config(name=name))
    for group, registry in (("eviction", EVICTIONS), ("cache", PREFIX_CACHES)):
        for name in registry.names():
            store.store(group=group, name=name, node=NamedConfig(name))


def resolved_overlap(cfg: Config) -> bool:
    """engine.overlap, its None resolved: off only for the engine on a CPU (the simulator models
    a GPU engine)."""
    e = cfg.engine
    if e.overlap is not None:
        return bool(e.overlap)
    return not (cfg.backend.name == "engine" and e.on_cpu)


def check(cfg: Config) -> None:
    """Every part checks its own settings; a name is checked by the registry of its part."""
    try:
        if cfg.backend.name not in BACKENDS:
            _bad("backend", cfg.backend.name, ", ".join(BACKENDS))
        if isinstance(cfg.backend, HttpBackendConfig):
            cfg.backend.validate()
        cfg.engine.validate()
        cfg.slo.validate()
        cfg.serve.validate()
        POLICIES.check(cfg.policy.name)
        cfg.policy.validate()
        cfg.scheduler.validate()
        cfg.scheduler.check_policy(cfg.policy)
        EVICTIONS.check(cfg.eviction.name)
        PREFIX_CACHES.check(cfg.cache.name)
        TRACES.check(cfg.trace.name)
        if isinstance(cfg.costmodel, Mapping) and "name" in cfg.costmodel:
            COST_MODELS.check(cfg.costmodel["name"])
        from testbed.sim.costmodel.hardware import available_hardware
        known = available_hardware()
        if cfg.hardware["name"] not in known:  # the name picks the calibrated profile: a typo would pick none
            _bad("hardware.name", cfg.hardware["name"], f"one of {', '.join(known)} (choose with hardware=NAME; "
                 f"another GPU: add conf/hardware/NAME.yaml with name: NAME)")
    except ValueError as err:  # a part's own error type, reported as a config error
        raise ConfigError(str(err)) from None


def _settings_of(path: str, policy: str) -> list[str] | None:
    """The setting names under a dotted config path (trace -> TraceConfig's fields; policy ->
    the config class of the policy named `policy`), or None."""
    import dataclasses
    import typing
    node: Any = Config
    for part in path.split(".") if path else []:
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        node = hints[part]
        if node is PolicyConfig and policy in POLICIES.names():
            node = POLICIES.get(policy).config
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else None


def not_a_setting(key: str, policy: str = PolicyConfig.name) -> str:
    """The line for a key the schema does not have, with the settings that are there; a moved
    one names its new key. policy: the run's policy (policy.* settings differ by policy)."""
    if key in MOVED:
        return f"{key} is now {MOVED[key]} (a deployment limit, the same for every policy)"
    parent, _, leaf = key.rpartition(".")
    known = _settings_of(parent, policy)
    if not known:
        return f"{key} is not a setting"
    where = f"policy={policy}" if parent == "policy" else parent
    line = f"{key} is not a setting" + (f" of {where}; its settings: " if parent else "; the settings: ") + \
        ", ".join(known)
    if parent == "policy":
        owners = [n for n in POLICIES.names() if leaf in own_knobs(POLICIES.get(n).config)]
        if owners:
            line += f" ({leaf} is a knob of policy={' and policy='.join(owners)})"
    if key in SIZED_STEPS:
        line += f"; the most tokens a step may hold is {SIZED_STEPS[key]}"
    return line


def policy_of(overrides: list[str]) -> str:
    """The policy a command line chooses (its last policy=NAME), else the default."""
    names = [o.split("=", 1)[1] for o in overrides if o.lstrip("+~").startswith("policy=")]
    return names[-1] if names else PolicyConfig.name


def composition_error(err: Exception, overrides: list[str] = ()) -> str:
    """Hydra's error for an override it cannot compose (a dozen lines and a stack-trace hint),
    as one line naming the override and what is allowed."""
    import re

    from hydra.errors import MissingConfigException
    text = str(err)
    if isinstance(err, MissingConfigException):
        m = re.search(r"Could not find '([^']+)'", text)
        g = re.search(r"Available options in '([^']+)'", text)  # the group: a value may hold slashes
        if m and g and err.options and m.group(1).startswith(g.group(1) + "/"):
            group, value = g.group(1), m.group(1)[len(g.group(1)) + 1:]
            line = f"{group}={value!r} is unknown; allowed: {', '.join(err.options)}"
            if group == "trace" and ("/" in value or "." in value):  # a path where a trace name goes
                line += f"; a file of yours: trace=file trace.path={value}"
            return line
    m = re.match(r"Could not override '([^']+)'", text)
    if m:
        return not_a_setting(m.group(1), policy_of(list(overrides)))
    m = re.match(r"Error merging override (\S+)", text)
    if m and err.__cause__ is not None:
        return f"{m.group(1)}: {str(err.__cause__).splitlines()[0]}"
    return text.splitlines()[0] if text else type(err).__name__


def compose_raw(overrides: list[str]):
    """The composed DictConfig of OVERRIDES (groups, schema, types), before the checks; Hydra's
    errors as Hydra raises them."""
    from pathlib import Path

    from hydra import compose as hydra_compose, initialize_config_dir

    register_schema()
    conf_dir = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def first_of_each_sweep(argv: list[str]) -> list[str]:
    """A multirun's overrides with each sweep (a,b,c / range / choice) at its first value: one
    job's overrides, to compose before Hydra starts the sweep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    out = []
    for o in OverridesParser.create().parse_overrides(list(argv)):
        if o.is_sweep_override():
            first = next(iter(o.sweep_string_iterator()), None)
            out.append(o.input_line if first is None else f"{o.get_key_element()}={first}")
        else:
            out.append(o.input_line)
    return out


def _unknown_keys(node, schema, path: str = "") -> list[str]:
    """Keys of a composed config that its dataclass schema does not have (an appended
    `+trace.x=3` would otherwise be dropped without a word). A node of a subclass (the
    policy's own config) is checked against that class."""
    import dataclasses
    import typing

    from omegaconf import OmegaConf
    hints = typing.get_type_hints(schema)
    out = []
    for key in node.keys():
        full = f"{path}{key}"
        if key not in hints:
            out.append(full)
        elif dataclasses.is_dataclass(hints[key]) and hasattr(node[key], "keys"):
            own = OmegaConf.get_type(node[key])
            sub = own if isinstance(own, type) and issubclass(own, hints[key]) else hints[key]
            out += _unknown_keys(node[key], sub, full + ".")
    return out


def to_config(dcfg) -> Config:
    """The composed DictConfig as a Config; a key the schema does not have is a ConfigError."""
    from omegaconf import OmegaConf
    bad = _unknown_keys(dcfg, Config)
    if bad:
        raise ConfigError(not_a_setting(bad[0], str(dcfg.policy.name)))
    return OmegaConf.to_object(dcfg)


def compose(overrides: list[str]) -> Config:
    """The run config of `python -m testbed.run OVERRIDES...`, for tools with their own entry
    point (testbed.profile, testbed.fidelity): the same groups, schema and checks; an override
    Hydra cannot compose is a ConfigError of one line, as on testbed.run's command line."""
    from hydra.errors import HydraException
    try:
        raw = compose_raw(overrides)
    except HydraException as e:
        raise ConfigError(composition_error(e, list(overrides))) from None
    cfg = to_config(raw)
    check(cfg)
    return cfg
