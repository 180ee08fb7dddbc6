"""One planned flashinfer call, recorded on a step's first layer and replayed on the others.

A step plans its attention wrapper once and then calls ``wrapper.run(q, (k, v), out=o)`` once
per layer. Each run() spends tens of microseconds of Python (argument checks, defaults, the
compiled kernel's ~30 arguments assembled) before one call into its compiled module, and
between layers only q, the layer's K/V cache and out differ. On the H200 machine that Python
was a large part of an eager step's launch time (Qwen3-0.6B: ~2.3 ms to enqueue a prefill
chunk whose kernels take about as long), so those steps ran at the host's speed.

:func:`record` runs the first layer through run() with the wrapper's compiled module swapped
for a recorder; when run() made exactly one call into the module, with q, k, v and out each
among its arguments exactly once (by identity), the other layers call that function directly
with their own four tensors in those places and every other argument as recorded. Anything
else (another flashinfer version's structure, a wrapper without a compiled module) leaves
every layer on run(), and says so once."""
from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger(__name__)
_said: set[str] = set()


class _Recorder:
    """Stands in for a wrapper's compiled module during one run(): forwards and records calls."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.calls: list[tuple[Callable, tuple, dict]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append((attr, args, kwargs))
            return attr(*args, **kwargs)
        return call


class LayerCall:
    """The recorded call with the positions of q, k, v and out among its arguments."""

    def __init__(self, fn: Callable, args: tuple, where: tuple[int, int, int, int]) -> None:
        self.fn, self.args, self.where = fn, list(args), where

    def __call__(self, q, k, v, out):
        a = self.args
        iq, ik, iv, io = self.where
        a[iq], a[ik], a[iv], a[io] = q, k, v, out
        self.fn(*a)
        return out


def _position(args: tuple, t) -> int | None:
    hits = [i for i, a in enumerate(args) if a is t]
    return hits[0] if len(hits) == 1 else None


def _no_replay(why: str) -> None:
    if why not in _said:
        _said.add(why)
        log.warning("flashinfer attention: every layer goes through wrapper.run() (%s)", why)


def record(wrapper, q, k, v, out):
    """Run one layer through ``wrapper.run`` -> (its output, a LayerCall for the step's other
    layers or None)."""
    module = getattr(wrapper, "_cached_module", None)
    if module is None:
        _no_replay(f"{type(wrapper).__name__} has no compiled module to record")
        return wrapper.run(q, (k, v), out=out), None
    rec = _Recorder(module)
    wrapper._cached_module = rec
    try:
        res = wrapper.run(q, (k, v), out=out)
    finally:
        wrapper._cached_module = module
    if res is not out or len(rec.calls) != 1 or rec.calls[0][2]:
        _no_replay(f"run() made {len(rec.calls)} calls into its module")
        return res, None
    fn, args, _ = rec.calls[0]
    where = tuple(_position(args, t) for t in (q, k, v, out))
    if any(w is None for w in where):
        _no_replay("q, k, v or out is not one of the compiled call's arguments")
        return res, None
    return res, LayerCall(fn, args, where)  # type: ignore[arg-type]
