"""Trace loaders: turn a trace file (or a synthetic recipe) into a list of requests with
arrival times, prompt token ids and output lengths.

    from testbed.traces import load_trace
    trace = load_trace(cfg)   # cfg: any object with TraceConfig's fields (or a mapping)

Light: numpy, and pandas for the file formats that need it (a loader's module is imported
when its trace is loaded: base.TRACES). Every problem raises TraceError (a ValueError) with a
one-line message naming the file, row and column.
"""
from __future__ import annotations

from typing import Any

from .base import TRACE_DIR, TRACES, Trace, TraceError, TraceRequest
from .config import OVER_CONTEXT_RULES, TraceConfig, resolve_config


def load_trace(cfg: Any = None, **overrides: Any) -> Trace:
    """Load the trace `cfg.name` (see TraceConfig for the fields and their defaults).
    Keyword overrides win over cfg, e.g. load_trace(cfg, num_requests=200)."""
    if overrides:
        base = resolve_config(cfg) if cfg is not None else TraceConfig()
        merged = {f: getattr(base, f) for f in TraceConfig.__dataclass_fields__}
        merged.update(overrides)
        cfg = merged
    k = resolve_config(cfg)
    return TRACES.get(k.name).obj(k)


__all__ = [
    "load_trace", "TRACES", "TRACE_DIR", "Trace", "TraceRequest", "TraceError",
    "TraceConfig", "OVER_CONTEXT_RULES",
]
