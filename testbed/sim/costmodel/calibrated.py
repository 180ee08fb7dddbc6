"""Calibrated cost model: host and device time of a step from a step profile of the real
engine (``python -m testbed.profile``; profiles in testbed/sim/costmodel/profiles/).

For a batch where request i extends by n_i tokens over c_i cached ones it predicts a
StepCost, the four times the simulator's executor places on its timeline (the engine's
overlap protocol, testbed/sim/executor.py):

* ``device``: a decode-only batch of B <= the largest CUDA graph runs in the smallest
  captured graph of size s >= B: ``a_s + b_s * KV tokens + i_s * imbalance`` (padding
  included: the size is s, not B; imbalance = rows x the longest context - the KV tokens: at
  batch 17-64 Llama-3.1-8B's graph decode takes as long as its longest rows; where the profile
  recorded flashinfer's split-KV decode plan, its busiest SM's KV and its longest block's tail
  instead, decode_plan.py). Anything else
  runs eagerly (in the piecewise CUDA graph of the smallest size >= its tokens, when the
  profile was measured with them): ``base(padded tokens)``, the measured curve of one fresh
  prompt of that many tokens, plus fitted seconds per unit of attention work, KV read, requests,
  imbalance and the attention kernel's busiest-SM load (fit.fa2_load) beyond that prompt's
  (negative attention terms where the step's own tokens attend over less than the padded prompt:
  padding rows run the linear layers, not attention);
  a mixed step near measured mixed shapes (the grid's, and other machine starts' kept in the
  profile's samples.local) times their residual over that fit (fit.LocalCorrection).
* ``host`` (schedule, batch build, upload), ``launch`` (enqueueing; a decode graph, a whole-step
  graph where the profile was measured with ``engine.whole_step_graphs`` and its rule,
  fit.WholeStepRule, takes the step, or eager) and
  ``complete`` (applying the result): linear in requests, tokens and KV tokens, the typical
  step of the profiler's host workloads; a decode step's ``host`` per policy. ``wake``: the
  factors on host and launch of a step launched after the host sat idle (the simulator's
  executor applies them), when the profile's serving workloads had such steps.

testbed/sim/costmodel/fit.py says how each part is fitted and why. A device shape beyond
the profiled range (more requests, tokens or KV tokens than any profiled step of its kind)
is predicted by the roofline instead, with a warning naming the shape (once per kind).

The profile records the model shape, hardware, engine settings, machine and versions it
was measured with; a run of another model / hardware / TP degree raises a ValueError naming
what differs (``costmodel.check=false`` uses it anyway, with a warning). ``costmodel=auto``
(the default) uses the profile named ``<hardware>_<model>`` when there is one and the
roofline otherwise.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from testbed.modelspec import ModelSpec
from testbed.sim.costmodel.base import COST_MODELS, StepCost, as_batch, costs_step_by_step
from testbed.sim.costmodel.decode_plan import DecodePlan
from testbed.sim.costmodel.eager_batch import EagerBatch
from testbed.sim.costmodel.fit import (EAGER_EXTRA, MODEL_FIELDS, PROFILE_FORMAT, Fa2Shape, LocalCorrection,
                                       base_curve, graph_lengths,
                                       padded_tokens, predict_host_parts, whole_step_rule)
from testbed.sim.costmodel.hardware import HardwareSpec

__all__ = ["CalibratedConfig", "CalibratedCostModel", "PROFILES_DIR", "available_profiles", "load_profile",
           "profile_for", "resolve_profile", "shipped_profile", "write_profile"]

#: Where profiles named without a path live.
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
REPO = Path(__file__).resolve().parents[3]


@dataclass
class CalibratedConfig:
    """conf/costmodel/calibrated.yaml mirrors these.

    profile: a profile name (testbed/sim/costmodel/profiles/<name>.json) or a path to a
        profile JSON (absolute, or relative to the working directory or the repo root); None:
        the one shipped for the run's hardware and model (<hardware>_<model>), else an error.
    check: refuse a profile measured on another model shape, hardware or TP degree (True), or
        use it anyway with a warning (False).
    tp: the deployment's TP degree (set from engine.tp by the simulator).
    policy: the run's policy (set from policy.name): its own host fit when the profile has
        one, else the fit over all profiled policies.
    host_scale: the run's host speed against the profile's: every host time (schedule, batch
        build, launch, complete) is multiplied by it (1.6: a host 1.6x slower). The H200
        machines measured here ran the same host work 1.5-2x slower on some machine starts, and
        for stretches of a start, than on others.
    """

    profile: str | None = None
    check: bool = True
    tp: int = 1
    policy: str = "all"
    host_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.profile is not None:
            if not isinstance(self.profile, (str, os.PathLike)) or not str(self.profile):
                raise ValueError(f"costmodel.profile={self.profile!r} is invalid; allowed: null (the run's "
                                 f"<hardware>_<model>), a profile name {available_profiles()} or a path to a profile .json")
            self.profile = os.fspath(self.profile)
        if not isinstance(self.check, bool):
            raise ValueError(f"costmodel.check={self.check!r} is invalid; allowed: true or false")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"engine.tp={self.tp!r} is invalid; allowed: an integer >= 1")
        if isinstance(self.host_scale, bool) or not isinstance(self.host_scale, (int, float)) \
                or not math.isfinite(self.host_scale) or self.host_scale <= 0:
            raise ValueError(f"costmodel.host_scale={self.host_scale!r} is invalid; allowed: a number > 0")
        self.host_scale = float(self.host_scale)


def available_profiles() -> list[str]:
    """Names of the profiles shipped in testbed/sim/costmodel/profiles/."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json")) if PROFILES_DIR.is_dir() else []


def profile_for(hardware: str, model: str | None) -> str | None:
    """The shipped profile of a hardware / model pair, if there is one (none for an unnamed model)."""
    if not model:
        return None
    name = f"{hardware}_{model}"
    return name if name in available_profiles() else None


def shipped_profile(hardware: str, model: str | None) -> str:
    """costmodel.profile=null: the profile shipped for the run's hardware and model, or the
    one-line error saying there is none."""
    name = profile_for(hardware, model)
    if name is None:
        raise ValueError(f"costmodel=calibrated: no profile of hardware={hardware} and model={model} is shipped "
                         f"(profiles: {available_profiles()}); give costmodel.profile=NAME or PATH, measure one "
                         f"with `python -m testbed.profile model={model} out=PATH` on a GPU, or use costmodel=auto "
                         f"(the roofline where there is no profile)")
    return name


def resolve_profile(profile: str | os.PathLike) -> Path:
    """The file of a profile name or path; ValueError naming what was tried when missing."""
    s = os.fspath(profile)
    p = Path(s).expanduser()
    if p.suffix != ".json" and os.sep not in s and "/" not in s:
        cand = [PROFILES_DIR / f"{s}.json"]
    elif p.is_absolute():
        cand = [p]
    else:
        cand = [Path.cwd() / p, REPO / p]
    for c in cand:
        if c.is_file():
            return c
    raise ValueError(f"costmodel.profile={s!r}: no such profile (looked for {', '.join(map(str, cand))}); "
                     f"allowed: a name in {available_profiles()} or a path to a profile .json "
                     f"(measure one with `python -m testbed.profile model=... out=PATH` on a GPU)")


def load_profile(profile: str | os.PathLike | Mapping[str, Any]) -> dict:
    """A profile dict from a name, a path or a dict; checks its format and parts."""
    if isinstance(profile, Mapping):
        prof, where = dict(profile), "<profile dict>"
    else:
        path = resolve_profile(profile)
        where = str(path)
        try:
            prof = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"costmodel.profile {where}: not valid JSON: {e}") from e
    if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT:
        got = prof.get("format") if isinstance(prof, dict) else type(prof).__name__
        raise ValueError(f"costmodel.profile {where}: format {got!r} is not supported; allowed: {PROFILE_FORMAT} "
                         f"(re-measure with `python -m testbed.profile`)")
    for key in ("model", "hardware", "engine", "device", "host"):
        if key not in prof:
            raise ValueError(f"costmodel.profile {where}: missing key {key!r}")
    for pol, fits in prof["host"].items():
        for part, coef in fits.items():
            bad = {k: v for k, v in coef.items() if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0}
            if bad:
                raise ValueError(f"costmodel.profile {where}: host.{pol}.{part} has invalid entries {bad}; "
                                 f"allowed: finite seconds >= 0")
    prof.setdefault("_path", where)
    return prof


def profile_mismatch(prof: Mapping[str, Any], spec: ModelSpec, hardware: HardwareSpec, tp: int) -> list[str]:
    """What differs between a profile and a run: ['model.hidden_size: profile 1024, run 4096', ...]."""
    out = []
    pm = prof["model"]
    if pm.get("name") and spec.name and pm["name"] != spec.name:
        out.append(f"model.name: profile {pm['name']!r}, run {spec.name!r}")
    for f in MODEL_FIELDS:
        if f in pm and pm[f] != getattr(spec, f):
            out.append(f"model.{f}: profile {pm[f]!r}, run {getattr(spec, f)!r}")
    ph = prof["hardware"].get("name")
    if ph != hardware.name:
        out.append(f"hardware.name: profile {ph!r}, run {hardware.name!r}")
    ptp = prof["engine"].get("tp", 1)
    if ptp != tp:
        out.append(f"engine.tp: profile {ptp!r}, run {tp!r}")
    return out


HOST_FEATURES = ("const", "reqs", "tokens", "kv_tokens")  # a host fit's terms; const's feature is 1.0


def _terms(coef: Mapping[str, float]) -> tuple[tuple[float, int], ...]:
    """A host fit as (coefficient, index into (1.0, reqs, tokens, kv_tokens)) in its own order,
    for _linear: no dict per step."""
    return tuple((v, HOST_FEATURES.index(k)) for k, v in coef.items())


def _linear(terms: tuple[tuple[float, int], ...], x: tuple) -> float:
    return sum([v * x[i] for v, i in terms])


class CalibratedCostModel:
    """Host and device time of a step from a profile; see the module docstring."""

    def __init__(self, spec: ModelSpec, hardware: HardwareSpec, cfg: CalibratedConfig | None = None,
                 profile: Mapping[str, Any] | None = None, policy: str | None = None):
        cfg = cfg if cfg is not None else CalibratedConfig()
        if profile is None:
            profile = cfg.profile if cfg.profile is not None else shipped_profile(hardware.name, spec.name)
        prof = load_profile(profile)
        diff = profile_mismatch(prof, spec, hardware, cfg.tp)
        if diff:
            msg = (f"costmodel.profile={cfg.profile or prof.get('name')!r} ({prof['_path']}) was measured on another deployment: "
                   + "; ".join(diff)
                   + f". Measure one for this deployment with `python -m testbed.profile` "
                     f"(profiles: {available_profiles()}), or set costmodel.check=false to use it anyway")
            if cfg.check:
                raise ValueError(msg)
            warnings.warn(msg, stacklevel=2)
        self.spec, self.hardware, self.cfg, self.profile = spec, hardware, cfg, prof
        self.name = prof.get("name") or Path(str(prof["_path"])).stem
        policy = policy or cfg.policy
        self.policy = policy if policy in prof["host"] else "all"
        k = cfg.host_scale
        fits = prof["host"][self.policy]
        self.host = {part: {f: v * k for f, v in coef.items()} for part, coef in fits.items() if part != "wake"}
        self._host_terms = {part: _terms(coef) for part, coef in self.host.items()}  # step_cost's, per step
        w = fits.get("wake")
        #: (idle gap in seconds, host factor, launch factor, device seconds added) of a step
        #: launched after an idle gap, or None: the profile's host workloads had too few such
        #: steps to fit it (a profile fitted before the device term: none added)
        self.wake = (w["gap_s"], w["host"], w["launch"], w.get("device_s", 0.0)) if w else None
        g = prof["device"]["graph"]
        self.sizes = np.array(g["sizes"] if g else [], np.int64)
        self.max_graph = int(self.sizes[-1]) if len(self.sizes) else 0
        self._g_const = np.array(g["const_s"] if g else [], float)
        self._g_slope = np.array(g["per_kv_token_s"] if g else [], float)
        #: the third feature's coefficients: the split-KV plan's load (decode_plan.py) where the
        #: profile recorded the plan, graph_imbalance otherwise (older profiles, other kernels)
        self._plan = DecodePlan(**g["plan"]) if g and g.get("plan") else None
        third = "per_load_token_s" if self._plan else "per_imbalance_s"
        self._g_third = np.array(g.get(third, [0.0] * len(self.sizes)) if g else [], float)
        #: with the plan, the fourth: its longest block's tail (profiles before it have none: zeros)
        self._g_tail = np.array(g.get("per_tail_token_s", [0.0] * len(self.sizes)) if g else [], float)
        # the same as plain lists, and the graph each batch size pads to: a step's price reads
        # them without numpy scalars (the same floats)
        self._graph_fit = [tuple(map(float, v)) for v in zip(self._g_const, self._g_slope, self._g_third, self._g_tail)]
        self._graph_at = np.searchsorted(self.sizes, np.arange(self.max_graph + 1)).tolist()
        e = prof["device"]["eager"]
        self._bt, self._bs = np.array(e["base_tokens"], float), np.array(e["base_s"], float)
        self._extra = np.array([e["coef_s"].get(k, 0.0) for k in EAGER_EXTRA], float)
        self._pieces = np.array(e.get("piece_sizes", []), float)  # empty: profiled without piecewise graphs
        self._base: dict[int, tuple[int, float]] = {}  # by tokens: (padded tokens, the base curve there)
        self._fa2 = Fa2Shape(**e["fa2"]) if e.get("fa2") else None
        self._local = None  # set below: the fitted price it corrects is computed without it
        #: the eager steps the engine ran as whole-step graphs (their own launch fit), or None
        self._whole = whole_step_rule(prof["engine"], e.get("piece_sizes", []), spec.num_q_heads // spec.num_kv_heads)
        if self._whole and "launch_whole" not in self.host:
            raise ValueError(f"costmodel.profile {prof['_path']}: measured with engine.whole_step_graphs but has no "
                             f"host.{self.policy}.launch_whole fit (re-fit it with `python -m testbed.profile refit=...`)")
        self.range = prof["device"]["range"]
        self._warned: set[str] = set()
        self._roofline = None
        if e.get("local") and self._fa2 is not None:
            smp = prof.get("samples", {})
            self._local = LocalCorrection.fit([*smp.get("device", []), *smp.get("local", [])], self.device_time,
                                              self._fa2, **e["local"])

    # ------------------------------------------------------------------ parts
    def is_graph(self, n: np.ndarray) -> bool:
        """Whether a batch of these extend lengths (each >= 1) runs in a decode CUDA graph."""
        return self._graph(n.shape[0], int(n.sum()))

    def _graph(self, b: int, tok: int) -> bool:
        """is_graph from a batch's sizes (every item extends by >= 1: all by exactly 1 when the
        tokens are as many as the items)."""
        return self.max_graph > 0 and b <= self.max_graph and tok == b

    def device_time(self, extend_lens, cached_lens) -> float:
        n, c = as_batch(extend_lens, cached_lens)
        b, tok = n.shape[0], int(n.sum())
        return self._device_time(n, c, b, tok, int(c.sum()) + tok, self._graph(b, tok))

    def _device_time(self, n: np.ndarray, c: np.ndarray, b: int, tok: int, kv: int, graph: bool) -> float:
        """device_time of a batch whose sizes the caller has (step_cost: computed once a step)."""
        if graph:
            i = self._graph_at[b]
            const, slope, third, tail = self._graph_fit[i]
            x3 = x4 = 0.0
            if self._plan is not None and (third or tail):
                x3, x4 = self._plan.features(graph_lengths(n, c, int(self.sizes[i])))
            elif third:  # graph_imbalance of a decode batch (every extend 1): its longest context is c.max() + 1
                x3 = float(int(self.sizes[i]) * (int(c.max()) + 1) - kv)
            return const + slope * kv + third * x3 + tail * x4
        kind = "decode" if tok == b else "prefill"
        if b > self.range["reqs"] or tok > self.range["tokens"] or kv > self.range["kv_tokens"]:
            return self._outside(kind, n, c, b, tok, kv)
        fa = self._fa2
        eb = EagerBatch(n, c, (tok, kv - tok))  # the batch's terms in ints, once (eager_batch says why)
        plan = eb.fa2_plan(fa) if fa is not None and tok > b else None  # the prefill kernel's
        load = eb.fa2_load(fa, plan) if plan else None
        got = self._base.get(tok)
        if got is None:  # a replay's eager steps have few distinct token counts (its chunk sizes)
            pad = self.padded(tok)
            got = self._base[tok] = (pad, float(base_curve(self._bt, self._bs, [pad])[0]))
        pad, base = got
        t = float(base + self._extra @ eb.extras(fa, pad, plan, load))
        if self._local is not None and plan and eb.decodes:  # a mixed step
            t *= self._local.factor_at(*eb.local_place(fa, plan, load))
        return t

    def padded(self, tokens: int) -> int:
        """The tokens an eager step of `tokens` new tokens runs its linear layers at: the size of
        the piecewise CUDA graph that holds it (its own beyond the largest, or without them)."""
        return int(padded_tokens(self._pieces, [tokens])[0])

    def _outside(self, kind, n, c, b, tok, kv) -> float:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"costmodel {self.name}: a {kind} step of {b} requests, {tok} new tokens and {kv} KV "
                          f"tokens is beyond the profiled range (at most {self.range['reqs']} requests, "
                          f"{self.range['tokens']} tokens, {self.range['kv_tokens']} KV tokens); its device time "
                          f"comes from the roofline (this warning is given once per step kind)", stacklevel=4)
        if self._roofline is None:
            from testbed.sim.costmodel.roofline import RooflineConfig, RooflineCostModel
            self._roofline = RooflineCostModel(self.spec, self.hardware, RooflineConfig(tp=self.cfg.tp))
        return self._roofline.step_time(n, c)

    def host_parts_arrays(self, reqs, tokens, kv_tokens) -> dict[str, np.ndarray]:
        """host_s, launch_s, complete_s for arrays of step features (a row per step)."""
        return predict_host_parts(self.host, reqs, tokens, kv_tokens, self.max_graph, self._whole)

    # ------------------------------------------------------------------ public API
    def step_cost(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> StepCost:
        n, c = as_batch(extend_lens, cached_lens)
        b, tok = n.shape[0], int(n.sum())
        kv = int(c.sum()) + tok
        x = (1.0, b, tok, kv)  # HOST_FEATURES
        h = self._host_terms
        graph = self._graph(b, tok)
        if tok == b:
            host, complete = h["host_decode"], h["complete_decode"]
        else:
            host, complete = h["host_prefill"], h["complete_prefill"]
        launch = h["launch_graph"] if graph else h["launch_whole"] if (
            tok != b and self._whole and self._whole.graph(tok, b)) else h["launch_eager"]
        return StepCost(_linear(host, x), _linear(launch, x), self._device_time(n, c, b, tok, kv, graph),
                        _linear(complete, x))

    def decode_costs(self, cached: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
        """step_cost of k decode steps over contexts cached + j (j < k), as arrays. A batch in a
        decode graph whose third feature is 0 or the imbalance is computed over the steps at
        once (the same float operations in the same order); the split-KV plan's load, and eager
        steps, step by step through step_cost."""
        b = len(cached)
        i = int(np.searchsorted(self.sizes, b)) if self._graph(b, b) else -1
        if i < 0 or (self._plan is not None and (self._g_third[i] or self._g_tail[i])):
            return costs_step_by_step(self, cached, k)
        j = np.arange(k, dtype=np.int64)
        kv = int(cached.sum()) + b * j + b
        s = int(self.sizes[i])
        x3 = (s * (int(cached.max()) + 1 + j) - kv).astype(float) if self._g_third[i] else 0.0  # graph_imbalance
        device = self._g_const[i] + self._g_slope[i] * kv + self._g_third[i] * x3
        x = (1.0, b, b, kv)  # as step_cost's, kv_tokens an array
        host, launch, complete = (np.broadcast_to(np.asarray(_linear(self._host_terms[part], x), float), (k,))
                                  for part in ("host_decode", "launch_graph", "complete_decode"))
        return host, launch, np.asarray(device, float), complete

    def step_time(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> float:
        """Device seconds for one step."""
        return self.device_time(extend_lens, cached_lens)

    def breakdown(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> dict[str, float]:
        """host / launch / device / complete seconds of the step (StepCost as a dict)."""
        s = self.step_cost(extend_lens, cached_lens)
        return {"host": s.host, "launch": s.launch, "device": s.device, "complete": s.complete}

    def kind(self, extend_lens, cached_lens) -> str:
        """``graph`` or ``eager``: how the engine runs the step."""
        n, _ = as_batch(extend_lens, cached_lens)
        return "graph" if self.is_graph(n) else "eager"

    def __repr__(self) -> str:
        return (f"CalibratedCostModel(profile={self.name}, model={self.spec.name or self.spec.architecture}, "
                f"hardware={self.hardware.name}, tp={self.cfg.tp}, host fit={self.policy})")


@COST_MODELS.register("calibrated", config=CalibratedConfig)
def _make_calibrated(spec: ModelSpec, hardware: HardwareSpec, cfg: CalibratedConfig) -> CalibratedCostModel:
    return CalibratedCostModel(spec, hardware, cfg)


def write_profile(prof: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write a profile as JSON (the samples' lists on one line each); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in prof.items() if k not in ("_path", "samples")}
    text = json.dumps(clean, indent=1)
    if "samples" in prof:  # a device sample, or a host column, per line: readable diffs, a tenth of the lines
        smp = prof["samples"]
        rows = "".join(f'  {json.dumps(g)}: [\n' + ",\n".join("   " + json.dumps(d) for d in smp[g]) + "\n  ],\n"
                       for g in ("device", "local") if g in smp)
        host = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in smp.get("host", {}).items())
        text = text[:-2] + f',\n "samples": {{\n{rows}  "host": {{\n{host}\n  }}\n }}\n}}'
    p.write_text(text + "\n")
    json.loads(p.read_text())  # what was written reads back
    return p
