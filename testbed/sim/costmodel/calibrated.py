"""Calibrated cost model: step time fitted to a GPU engine run (a profile in the repo).

A profile (``testbed/sim/costmodel/profiles/<name>.json``, written by
``benchmarks/calibrate.py RUN_DIR``) holds, per *step kind*, non-negative coefficients of a
few features that both an engine run's ``steps.parquet`` and the cost-model interface
``(extend_lens, cached_lens)`` can compute:

=============  =========================================================  ===================
feature        from (extend_lens n, cached_lens c)                        steps.parquet
=============  =========================================================  ===================
``const``      1 per step                                                 1
``reqs``       requests in the batch, ``len(n)``                          ``batch_reqs``
``tokens``     new tokens computed, ``sum(n)``                            ``prefill_tokens + decode_tokens``
``kv_tokens``  KV tokens attended over, ``sum(c) + sum(n)``               ``context_tokens``
=============  =========================================================  ===================

Step kinds follow the engine's own rule (``EngineExecutor.launch_host``):

* ``graph``: every ``extend_len == 1`` and ``len(n) <= cuda_graph_max_bs``: a decode-only
  step replayed as a CUDA graph (a handful of launches; GPU-bound).
* ``eager``: anything else (a prefill chunk in the batch, or a decode batch too large for
  the graphs): run op by op, which on a small model is bound by the CPU launching kernels.
  An eager step is predicted as ``max(eager fit, graph fit)`` of its features: running
  op by op is never faster than the same work in a graph, and this keeps the prediction
  monotone in the batch where the eager fit found no significant slope (its GPU work hidden
  under the launch time in the profiled range).

``step_time`` is the seconds one step adds to the simulated clock. The fit's default target
(``wall``) is the wall-clock time each step adds to the engine's timeline as its driver records
it, overlap scheduling included: with overlap, an eager step's CPU launch runs while the step
before it is in flight and delays that step's end, so each eager step is fitted together with
that step (least squares on the sums over such groups). ``target=device`` fits the measured
device time per step (``duration_s``) instead, which leaves out device idle time that the
overlap does not hide.

What the engine does that a step time cannot say is not modelled here: the engine publishes a
step's tokens when it collects the step, after it has launched the next one, so a token
followed by an eager step appears about one eager launch later; a request arriving while a
step is being prepared waits one step more (overlap's lag); the first steps' warm-up.

The profile records the model shape, hardware, and engine settings it was measured with;
building the model for a run of another model / hardware / TP degree raises a
``ValueError`` naming what differs (``costmodel.check=false`` uses it anyway, with a
warning).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from testbed.modelspec import ModelSpec
from testbed.sim.costmodel.base import as_batch, register_cost_model
from testbed.sim.costmodel.hardware import HardwareSpec

__all__ = [
    "CalibratedConfig",
    "CalibratedCostModel",
    "FEATURES",
    "KIND_FEATURES",
    "PROFILE_FORMAT",
    "PROFILES_DIR",
    "available_profiles",
    "fit_profile",
    "load_profile",
    "nnls",
    "nnls_numpy",
    "resolve_profile",
    "step_features",
    "write_profile",
]

#: Where profiles named without a path live.
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
REPO = Path(__file__).resolve().parents[3]
PROFILE_FORMAT = 1

#: The features and their definitions (written into every profile).
FEATURES = {
    "const": "1 per step",
    "reqs": "requests in the batch: len(extend_lens) (steps.parquet batch_reqs)",
    "tokens": "new tokens computed: sum(extend_lens) (steps.parquet prefill_tokens + decode_tokens)",
    "kv_tokens": "KV tokens attended over: sum(cached_lens) + sum(extend_lens) (steps.parquet context_tokens)",
}
#: Features fitted per kind. In a graph step tokens == reqs, so ``tokens`` is left out there.
KIND_FEATURES = {"graph": ("const", "reqs", "kv_tokens"), "eager": ("const", "reqs", "tokens", "kv_tokens")}
KIND_RULE = {
    "graph": "every extend_len == 1 and len(extend_lens) <= cuda_graph_max_bs: a decode step replayed as a CUDA graph",
    "eager": "otherwise (a prefill chunk in the batch, or a decode batch above cuda_graph_max_bs): run op by op; "
             "predicted as max(eager fit, graph fit)",
}
#: ModelSpec fields a profile must agree on with the run.
MODEL_FIELDS = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_q_heads",
                "num_kv_heads", "head_dim", "vocab_size", "dtype_bytes")
TERMS = ("const", "reqs", "tokens", "kv_tokens")


# ---------------------------------------------------------------------- config + profiles
@dataclass
class CalibratedConfig:
    """conf/costmodel/calibrated.yaml mirrors these.

    profile: a profile name (testbed/sim/costmodel/profiles/<name>.json) or a path to a
        profile JSON (absolute, or relative to the working directory or the repo root).
    check: refuse a profile fitted on another model shape, hardware or TP degree (True), or
        use it anyway with a warning (False).
    tp: the deployment's TP degree (set from engine.tp by the simulator).
    """

    profile: str = "h200_qwen3_0_6b"
    check: bool = True
    tp: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.profile, (str, os.PathLike)) or not str(self.profile):
            raise ValueError(f"costmodel.profile={self.profile!r} is invalid; allowed: a profile name "
                             f"{available_profiles()} or a path to a profile .json")
        self.profile = os.fspath(self.profile)
        if not isinstance(self.check, bool):
            raise ValueError(f"costmodel.check={self.check!r} is invalid; allowed: true or false")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"costmodel.tp={self.tp!r} is invalid; allowed: an integer >= 1")


def available_profiles() -> list[str]:
    """Names of the profiles shipped in testbed/sim/costmodel/profiles/."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json")) if PROFILES_DIR.is_dir() else []


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
                     f"(write one with `python benchmarks/calibrate.py RUN_DIR --out PATH`)")


def load_profile(profile: str | os.PathLike | Mapping[str, Any]) -> dict:
    """A profile dict from a name, a path or a dict; checks its format and coefficients."""
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
        raise ValueError(f"costmodel.profile {where}: format {got!r} is not supported; allowed: {PROFILE_FORMAT}")
    for key in ("model", "hardware", "engine", "kinds"):
        if key not in prof:
            raise ValueError(f"costmodel.profile {where}: missing key {key!r}")
    for kind in KIND_FEATURES:
        coef = prof["kinds"].get(kind, {}).get("coef_s")
        if not isinstance(coef, Mapping):
            raise ValueError(f"costmodel.profile {where}: kinds.{kind}.coef_s is missing")
        bad = {k: v for k, v in coef.items()
               if k not in TERMS or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0}
        if bad:
            raise ValueError(f"costmodel.profile {where}: kinds.{kind}.coef_s has invalid entries {bad}; "
                             f"allowed: features {list(TERMS)} with finite seconds >= 0")
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


# ---------------------------------------------------------------------- the model
class CalibratedCostModel:
    """Step time from a fitted profile; see the module docstring."""

    def __init__(self, spec: ModelSpec, hardware: HardwareSpec, cfg: CalibratedConfig | None = None,
                 profile: Mapping[str, Any] | None = None):
        cfg = cfg if cfg is not None else CalibratedConfig()
        prof = load_profile(profile if profile is not None else cfg.profile)
        diff = profile_mismatch(prof, spec, hardware, cfg.tp)
        if diff:
            msg = (f"costmodel.profile={cfg.profile!r} ({prof['_path']}) was fitted on another deployment: "
                   + "; ".join(diff)
                   + f". Fit one for this run with `python benchmarks/calibrate.py RUN_DIR --out PATH` "
                     f"(profiles: {available_profiles()}), or set costmodel.check=false to use it anyway")
            if cfg.check:
                raise ValueError(msg)
            warnings.warn(msg, stacklevel=2)
        self.spec, self.hardware, self.cfg, self.profile = spec, hardware, cfg, prof
        self.name = prof.get("name") or Path(str(prof["_path"])).stem
        self.max_bs = int(prof["engine"].get("cuda_graph_max_bs") or 0)
        g, e = prof["kinds"]["graph"]["coef_s"], prof["kinds"]["eager"]["coef_s"]
        self._g = tuple(float(g.get(t, 0.0)) for t in TERMS)
        self._e = tuple(float(e.get(t, 0.0)) for t in TERMS)

    # ------------------------------------------------------------------ vectorised core
    def predict(self, reqs, tokens, kv_tokens) -> np.ndarray:
        """Seconds per step for arrays of features (a row per step; what steps.parquet has)."""
        b = np.asarray(reqs, dtype=np.float64)
        t = np.asarray(tokens, dtype=np.float64)
        kv = np.asarray(kv_tokens, dtype=np.float64)
        g0, g1, g2, g3 = self._g
        e0, e1, e2, e3 = self._e
        graph = g0 + g1 * b + g2 * t + g3 * kv
        eager = np.maximum(e0 + e1 * b + e2 * t + e3 * kv, graph)
        return np.where((t == b) & (b <= self.max_bs), graph, eager)

    def predict_steps(self, steps) -> np.ndarray:
        """Seconds per row of a steps.parquet frame."""
        f = step_features(steps)
        return self.predict(f["reqs"], f["tokens"], f["kv_tokens"])

    def _terms(self, extend_lens, cached_lens) -> tuple[float, float, float, float]:
        n, c = as_batch(extend_lens, cached_lens)
        b = n.shape[0]
        tok = int(n.sum())
        kv = int(c.sum()) + tok
        g0, g1, g2, g3 = self._g
        gt = (g0, g1 * b, g2 * tok, g3 * kv)
        if tok == b and b <= self.max_bs:
            return gt
        e0, e1, e2, e3 = self._e
        et = (e0, e1 * b, e2 * tok, e3 * kv)
        return et if sum(et) >= sum(gt) else gt

    # ------------------------------------------------------------------ public API
    def step_time(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> float:
        """Seconds for one step; raises ValueError on an empty or malformed batch."""
        return sum(self._terms(extend_lens, cached_lens))

    def breakdown(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> dict[str, float]:
        """Seconds per feature (``const``, ``reqs``, ``tokens``, ``kv_tokens``) of the kind that
        applies; the values sum to ``step_time``."""
        return dict(zip(TERMS, self._terms(extend_lens, cached_lens)))

    def kind(self, extend_lens, cached_lens) -> str:
        """``graph`` or ``eager`` (the fit that gives the time)."""
        n, c = as_batch(extend_lens, cached_lens)
        return "graph" if (int(n.sum()) == n.shape[0] and n.shape[0] <= self.max_bs) else "eager"

    def __repr__(self) -> str:
        return (f"CalibratedCostModel(profile={self.name}, model={self.spec.name or self.spec.architecture}, "
                f"hardware={self.hardware.name}, tp={self.cfg.tp})")


@register_cost_model("calibrated", config_cls=CalibratedConfig)
def _make_calibrated(spec: ModelSpec, hardware: HardwareSpec, cfg: CalibratedConfig) -> CalibratedCostModel:
    return CalibratedCostModel(spec, hardware, cfg)


# ---------------------------------------------------------------------- fitting
def step_features(steps) -> dict[str, np.ndarray]:
    """The features of each row of a steps.parquet frame (see ``FEATURES``)."""
    reqs = np.asarray(steps["batch_reqs"], dtype=np.float64)
    return {
        "const": np.ones_like(reqs),
        "reqs": reqs,
        "tokens": np.asarray(steps["prefill_tokens"], dtype=np.float64) + np.asarray(steps["decode_tokens"], dtype=np.float64),
        "kv_tokens": np.asarray(steps["context_tokens"], dtype=np.float64),
    }


def step_kinds(steps, cuda_graph_max_bs: int) -> np.ndarray:
    """'graph' or 'eager' per row of a steps frame, by the engine's rule."""
    f = step_features(steps)
    return np.where((f["tokens"] == f["reqs"]) & (f["reqs"] <= cuda_graph_max_bs), "graph", "eager")


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0: scipy's when installed, else ``nnls_numpy``."""
    try:
        from scipy.optimize import nnls as _sp
    except ImportError:
        return nnls_numpy(a, b)
    return _sp(a, b)[0]


def nnls_numpy(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Lawson-Hanson active-set NNLS in numpy (a few columns; the light install has no scipy)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ b
    tol = 10 * np.finfo(float).eps * np.abs(a).sum(axis=0).max(initial=0.0) * max(m, n)
    for _ in range(max_iter or 3 * n):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            neg = passive & (z <= tol)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
        w = a.T @ (b - a @ x)
    return x


def error_stats(pred: np.ndarray, meas: np.ndarray) -> dict:
    """Per-step relative errors: median / p90 |rel err|, mean rel err (bias), total-time error."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    if not len(meas):
        return {"n": 0}
    rel = (pred - meas) / meas
    return {
        "n": int(len(meas)),
        "measured_median_ms": float(np.median(meas) * 1e3),
        "predicted_median_ms": float(np.median(pred) * 1e3),
        "median_abs_rel_err": float(np.median(np.abs(rel))),
        "p90_abs_rel_err": float(np.percentile(np.abs(rel), 90)),
        "mean_rel_err": float(rel.mean()),
        "total_time_rel_err": float(pred.sum() / meas.sum() - 1.0),
    }


def _run_date(run: Path) -> str | None:
    """The commit date of the run's steps.parquet when it is in git, else the file's mtime."""
    f = run / "steps.parquet"
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cI", "--", f.name], cwd=run,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        if out:
            return out
    except (OSError, subprocess.SubprocessError):
        pass
    return _dt.datetime.fromtimestamp(f.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")


def _display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p.resolve())


def _step_kind_label(steps) -> np.ndarray:
    """decode / mixed / prefill, as analysis.compare.step_time_error names them."""
    pr, dr = np.asarray(steps["prefill_reqs"]), np.asarray(steps["decode_reqs"])
    return np.where(pr > 0, np.where(dr > 0, "mixed", "prefill"), "decode")


TARGETS = {
    "wall": "the engine's wall-clock time per step as the driver records it: end_s of the step minus end_s "
            "of the one before (or minus its own start_s after an idle gap). With overlap scheduling an "
            "eager step's CPU launch (~ its whole time on a small model) runs while the step before it "
            "is still in flight and delays that step's end, so each eager step is fitted together with "
            "the step whose interval holds its launch: least squares on the sums over such groups.",
    "device": "duration_s: the engine's device time per step (CUDA events around the step); leaves out "
              "device idle time between steps (a CPU-bound launch not hidden by the overlap).",
}


def _units(steps, max_bs: int, target: str):
    """Per step: feature matrix (graph columns, then eager ones), the target seconds and a unit id
    (steps fitted together: singletons, or for target 'wall' an eager step joined to the step
    before it when they ran back to back)."""
    f = step_features(steps)
    graph = step_kinds(steps, max_bs) == "graph"
    cols = []
    for kind, names in KIND_FEATURES.items():
        on = graph if kind == "graph" else ~graph
        cols += [np.where(on, f[n], 0.0) for n in names]
    x = np.column_stack(cols)
    start, end = steps["start_s"].to_numpy(float), steps["end_s"].to_numpy(float)
    prev_end = np.concatenate([[-np.inf], end[:-1]])
    back_to_back = start < prev_end
    if target == "device":
        y = steps["duration_s"].to_numpy(float)
        new_unit = np.ones(len(y), dtype=bool)
    elif target == "wall":
        y = end - np.maximum(start, prev_end)
        new_unit = ~(back_to_back & ~graph)
    else:
        raise ValueError(f"target={target!r} is invalid; allowed: {list(TARGETS)}")
    if len(new_unit):
        new_unit[0] = True
    return x, y, np.cumsum(new_unit) - 1, graph


def _group_sum(a: np.ndarray, ids: np.ndarray) -> np.ndarray:
    out = np.zeros((ids.max() + 1 if len(ids) else 0,) + a.shape[1:])
    np.add.at(out, ids, a)
    return out


def _unit_errors(coef: np.ndarray, x, y, ids, graph) -> dict:
    xs, ys = _group_sum(x, ids), _group_sum(y, ids)
    has_eager = _group_sum((~graph).astype(float), ids) > 0
    ng = len(KIND_FEATURES["graph"])
    pg, pe = xs[:, :ng] @ coef[:ng], xs[:, ng:] @ coef[ng:]
    # the model's rule: an eager step is max(eager fit, graph fit) of its own features
    fe = x[:, ng:]
    gfe = np.column_stack([fe[:, list(KIND_FEATURES["eager"]).index(n)] for n in KIND_FEATURES["graph"]])
    floor = _group_sum(np.where(~graph, np.maximum(gfe @ coef[:ng] - fe @ coef[ng:], 0.0), 0.0), ids)
    pred = pg + pe + floor
    return {"all": error_stats(pred, ys), "graph": error_stats(pred[~has_eager], ys[~has_eager]),
            "eager": error_stats(pred[has_eager], ys[has_eager])}


def fit_profile(run_dir: str | os.PathLike, *, fit_fraction: float = 1.0, name: str | None = None,
                skip_first: int = 1, target: str = "wall") -> dict:
    """Fit a profile to an engine run directory (steps.parquet + summary.json).

    target: ``wall`` (default) or ``device``, see ``TARGETS``. fit_fraction: fit on the first
    fraction of the steps (in time order) and report the error on the rest too (held out).
    skip_first: leave out the run's first steps (the first step pays one-time warm-up).
    Returns the profile dict (``write_profile`` saves it).
    """
    import pandas as pd

    from testbed.modelspec import load_model_spec

    run = Path(run_dir)
    summ_path, steps_path = run / "summary.json", run / "steps.parquet"
    for p in (summ_path, steps_path):
        if not p.is_file():
            raise FileNotFoundError(f"{run}: no {p.name}; calibrate from an engine run directory")
    summary = json.loads(summ_path.read_text())
    cfg = summary.get("config", {})
    if summary.get("backend") != "engine":
        raise ValueError(f"{run}: backend is {summary.get('backend')!r}; calibrate from a backend=engine run")
    if not (0.0 < fit_fraction <= 1.0):
        raise ValueError(f"fit_fraction={fit_fraction!r} is invalid; allowed: a number in (0, 1]")
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is invalid; allowed: {list(TARGETS)}")
    steps = pd.read_parquet(steps_path).sort_values("step").reset_index(drop=True)
    eng = cfg.get("engine", {})
    kv_info = summary.get("kv", {})
    max_bs = int(eng.get("cuda_graph_max_bs") or 0) if kv_info.get("cuda_graphs", True) else 0
    mcfg = cfg.get("model", {})
    spec = load_model_spec(mcfg.get("path") or mcfg["config_path"], name=mcfg.get("name"))

    x, y, ids, graph = _units(steps, max_bs, target)
    keep = np.arange(len(steps)) >= skip_first
    keep &= ids >= (ids[skip_first] if skip_first < len(ids) else 0)  # whole units only
    x, y, ids, graph, used = x[keep], y[keep], ids[keep] - (ids[keep][0] if keep.any() else 0), graph[keep], steps[keep]
    n_fit = int(round(len(used) * fit_fraction))
    fit_units = ids <= ids[n_fit - 1] if n_fit else np.zeros(len(ids), bool)
    xs, ys = _group_sum(x[fit_units], ids[fit_units]), _group_sum(y[fit_units], ids[fit_units])
    ng = len(KIND_FEATURES["graph"])
    for kind, cols in (("graph", slice(0, ng)), ("eager", slice(ng, None))):
        if (xs[:, cols][:, 0] > 0).sum() < 2:
            raise ValueError(f"{run}: too few {kind} steps in the fitted part to fit them")
    scale = np.where(xs.max(axis=0) > 0, xs.max(axis=0), 1.0)  # conditioning: features span 1 .. 1e5
    coef = nnls(xs / scale, ys) / scale
    kinds = {}
    for kind, cols in (("graph", slice(0, ng)), ("eager", slice(ng, None))):
        kinds[kind] = {"rule": KIND_RULE[kind], "features": list(KIND_FEATURES[kind]),
                       "coef_s": {f: float(v) for f, v in zip(KIND_FEATURES[kind], coef[cols])}}
    fit_part, held = used[fit_units], used[~fit_units]
    prof = {
        "format": PROFILE_FORMAT,
        "name": name,
        "target": target,
        "target_definition": TARGETS[target],
        "features": dict(FEATURES),
        "kinds": kinds,
        "model": {"name": mcfg.get("name"), **{f: getattr(spec, f) for f in MODEL_FIELDS},
                  "weights": mcfg.get("weights")},
        "hardware": dict(cfg.get("hardware") or {}),
        "engine": {k: eng.get(k) for k in ("tp", "page_size", "attention", "dtype", "overlap",
                                           "cuda_graph_max_bs", "device")}
                  | {"num_pages": kv_info.get("num_pages"), "cuda_graphs": kv_info.get("cuda_graphs")},
        "versions": summary.get("versions", {}),
        "source": {
            "run": _display_path(run),
            "run_date": _run_date(run),
            "fitted_on": _dt.date.today().isoformat(),
            "trace": cfg.get("trace", {}).get("name"),
            "num_requests": summary.get("trace", {}).get("num_requests"),
            "policy": cfg.get("policy", {}).get("name"),
            "steps_total": int(len(steps)),
            "skip_first": int(skip_first),
            "fit_fraction": float(fit_fraction),
            "fit_steps": [int(fit_part["step"].iloc[0]), int(fit_part["step"].iloc[-1])] if len(fit_part) else None,
            "fit_until_s": float(fit_part["end_s"].iloc[-1]) if len(fit_part) else None,
        },
    }
    fu = fit_units
    fit = {"units": "graph: a decode step alone; eager: an eager step with the step whose interval holds its "
                    "launch (target wall), or alone (target device)",
           "in_sample": _unit_errors(coef, x[fu], y[fu], ids[fu] - ids[fu].min(), graph[fu])}
    if (~fu).any():
        fit["held_out"] = _unit_errors(coef, x[~fu], y[~fu], ids[~fu] - ids[~fu].min(), graph[~fu])
    # beside the roofline: per step against the device time, by what the step ran
    model = CalibratedCostModel(spec, HardwareSpec(**prof["hardware"]) if prof["hardware"] else _any_hw(),
                                CalibratedConfig(tp=int(eng.get("tp", 1))), profile=prof)
    lab, meas = _step_kind_label(used), used["duration_s"].to_numpy(float)
    cal = model.predict_steps(used)
    fit["device_time_per_step"] = {k: error_stats(cal[lab == k], meas[lab == k]) for k in ("decode", "mixed", "prefill")}
    if "predicted_s" in used and used["predicted_s"].notna().all():
        roof = used["predicted_s"].to_numpy(float)
        fit["roofline_device_time_per_step"] = {k: error_stats(roof[lab == k], meas[lab == k])
                                                for k in ("decode", "mixed", "prefill")}
    prof["fit"] = fit
    return prof


def _any_hw() -> HardwareSpec:
    return HardwareSpec("unknown", 1.0, 1.0, 1.0, 1.0)


def write_profile(prof: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write a profile as indented JSON (keys in a stable order); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in prof.items() if k != "_path"}
    p.write_text(json.dumps(clean, indent=2) + "\n")
    return p
