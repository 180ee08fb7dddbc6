"""The trace knobs: defaults, reading them from any config object, and checking them."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .base import TRACES, TraceError

OVER_CONTEXT_RULES = ("reject", "truncate")
# trace.format of a user's file (name="file"): auto reads it from the content (user_file.py)
FILE_FORMATS = ("auto", "testbed", "mooncake", "burstgpt", "sharegpt")
DEFAULT_VOCAB = 32000


@dataclass
class TraceConfig:
    """Every knob a loader reads, with its default. `load_trace` accepts any object with
    (some of) these attributes, or a mapping; missing ones take these defaults."""

    name: str = "sharegpt"  # the trace: a bundled one, synthetic, or file (trace.path)
    path: str | None = None  # override of the bundled file; required for name="file"
    format: str = "auto"  # name="file": auto (from the content), testbed, mooncake (also AIPerf), burstgpt, sharegpt (vllm bench JSON)
    tokenizer: str | None = None  # format=sharegpt: a tokenizer.json (or its folder) to count tokens; null: estimate from characters
    chars_per_token: float = 4.0  # format=sharegpt without a tokenizer: tokens = ceil(characters / this)
    num_requests: int | None = 1000  # None or 0: every row
    rate: float = 4.0  # req/s when arrivals are synthesized; inf: all at t=0
    burstiness: float = 1.0  # Gamma shape of inter-arrival gaps; 1 = Poisson
    time_scale: float = 1.0  # multiplies trace timestamps
    seed: int = 0  # arrivals, shuffling and token ids (the run's seed by default)
    shuffle: bool = True  # length-only CSV traces: shuffle rows before taking num_requests
    over_context: str = "reject"  # "reject" | "truncate"
    block_size: int = 512  # tokens per prefix block of a file trace's prefix_ids
    vocab_size: int | None = None  # token ids are drawn in [0, vocab_size); None: the model's vocabulary (32000 outside a run)
    max_context: int | None = None  # prompt + output limit: narrows the model's context for the whole run (trace, scheduler, engine); null: the model's
    # name="synthetic"
    prompt_len_min: int = 128  # synthetic: prompt lengths uniform in [min, max]
    prompt_len_max: int = 2048  # synthetic: the longest prompt
    output_len_min: int = 32  # synthetic: output lengths uniform in [min, max]
    output_len_max: int = 512  # synthetic: the longest output
    num_prefix_groups: int = 0  # 0: no shared prefixes
    prefix_len: int = 64  # shared prefix tokens of each group (part of the prompt)


_NULLABLE = {"path", "num_requests", "max_context", "tokenizer"}


def _read(cfg: Any, key: str, default: Any) -> Any:
    if cfg is None:
        return default
    try:  # a missing key of a struct-mode DictConfig raises a KeyError / AttributeError subclass
        value = cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key)
    except (AttributeError, KeyError):
        value = default
    if value is None and key not in _NULLABLE:
        return default
    return value


def bad_value(key: str, value: Any, allowed: str) -> TraceError:
    return TraceError(f"trace config: {key}={value!r} is not allowed; {allowed}")


def _as_int(key: str, value: Any, allowed: str) -> int:
    if isinstance(value, bool):
        raise bad_value(key, value, allowed)
    if isinstance(value, int):
        return int(value)
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise bad_value(key, value, allowed) from None
    if not math.isfinite(as_float) or as_float != int(as_float):
        raise bad_value(key, value, allowed)
    return int(as_float)


def _as_float(key: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool):
        raise bad_value(key, value, allowed)
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise bad_value(key, value, allowed) from None
    if math.isnan(out):
        raise bad_value(key, value, allowed)
    return out


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int,)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise bad_value(key, value, "use true or false")


def resolve_config(cfg: Any) -> TraceConfig:
    """Read every knob from `cfg` (attribute access, or a mapping) and check the ones every
    trace reads; a loader checks its own (synthetic.py)."""
    raw = {f.name: _read(cfg, f.name, f.default) for f in fields(TraceConfig)}
    k = TraceConfig(**raw)

    name = str(k.name)
    TRACES.check(name)
    path = None if k.path in (None, "") else str(k.path)
    fmt = str(k.format)
    if fmt not in FILE_FORMATS:
        raise bad_value("format", k.format, f"use one of {', '.join(FILE_FORMATS)}")
    if fmt != "auto" and name != "file":
        raise bad_value("format", k.format, f"it applies to name=file only (this is {name!r}); leave it auto")
    tokenizer = None if k.tokenizer in (None, "") else str(k.tokenizer)
    cpt = _as_float("chars_per_token", k.chars_per_token, "use a finite float > 0")
    if not (cpt > 0 and math.isfinite(cpt)):
        raise bad_value("chars_per_token", k.chars_per_token, "use a finite float > 0")

    if k.num_requests is None:
        num = None
    else:
        num = _as_int("num_requests", k.num_requests, "use an int >= 0 (0 or null: every row)")
        if num < 0:
            raise bad_value("num_requests", k.num_requests, "use an int >= 0 (0 or null: every row)")
        num = num or None

    rate = _as_float("rate", k.rate, "use a float > 0 (req/s), or inf for all at t=0")
    if not rate > 0:
        raise bad_value("rate", k.rate, "use a float > 0 (req/s), or inf for all at t=0")
    burst = _as_float("burstiness", k.burstiness, "use a finite float > 0 (1 = Poisson)")
    if not (burst > 0 and math.isfinite(burst)):
        raise bad_value("burstiness", k.burstiness, "use a finite float > 0 (1 = Poisson)")
    scale = _as_float("time_scale", k.time_scale, "use a finite float > 0")
    if not (scale > 0 and math.isfinite(scale)):
        raise bad_value("time_scale", k.time_scale, "use a finite float > 0")
    seed = _as_int("seed", k.seed, "use an int >= 0")
    if seed < 0:
        raise bad_value("seed", k.seed, "use an int >= 0")
    shuffle = _as_bool("shuffle", k.shuffle)
    rule = str(k.over_context)
    if rule not in OVER_CONTEXT_RULES:
        raise bad_value("over_context", k.over_context, f"use one of {', '.join(OVER_CONTEXT_RULES)}")
    block = _as_int("block_size", k.block_size, "use an int >= 1")
    if block < 1:
        raise bad_value("block_size", k.block_size, "use an int >= 1")
    # outside a run (which passes the model's vocabulary) ids default to a Llama-2-sized vocabulary
    vocab = DEFAULT_VOCAB if k.vocab_size is None else _as_int("vocab_size", k.vocab_size, "use an int in [2, 2**31)")
    if not 2 <= vocab < 2**31:
        raise bad_value("vocab_size", k.vocab_size, "use an int in [2, 2**31)")
    if k.max_context is None:
        max_ctx = None
    else:
        max_ctx = _as_int("max_context", k.max_context, "use an int >= 2, or null for no check")
        if max_ctx < 2:
            raise bad_value("max_context", k.max_context, "use an int >= 2, or null for no check")

    synth = {}
    for key in ("prompt_len_min", "prompt_len_max", "output_len_min", "output_len_max",
                "num_prefix_groups", "prefix_len"):
        synth[key] = _as_int(key, getattr(k, key), "use an int")
    return replace(k, name=name, path=path, format=fmt, tokenizer=tokenizer, chars_per_token=cpt,
                   num_requests=num, rate=rate, burstiness=burst,
                   time_scale=scale, seed=seed, shuffle=shuffle, over_context=rule,
                   block_size=block, vocab_size=vocab, max_context=max_ctx, **synth)
