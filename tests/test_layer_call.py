"""Recording a planned attention wrapper's compiled call on one layer and replaying it on the
others (testbed/engine/attention/layer_call.py), against wrappers shaped like flashinfer's."""
from __future__ import annotations

import logging

import torch

from testbed.engine.attention import layer_call


class Module:
    def __init__(self):
        self.seen = []

    def paged_run(self, ws, q, k, v, out, scale, flag):
        self.seen.append((q, k, v, out, scale, flag))
        out.copy_(q * scale + k.sum() - v.sum())


class Wrapper:
    """run() checks, derives arguments, then makes `calls` calls into its module."""

    def __init__(self, calls=1, pass_q_twice=False):
        self._cached_module = Module()
        self.calls, self.twice, self.ws = calls, pass_q_twice, torch.zeros(4)

    def run(self, q, kv, out=None):
        k, v = kv
        for _ in range(self.calls):
            self._cached_module.paged_run(self.ws, q, k, v if not self.twice else q, out, 2.0, True)
        return out


def tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 2, generator=g) for _ in range(3)] + [torch.empty(3, 2)]


def test_the_other_layers_call_the_recorded_function_with_their_own_tensors():
    w = Wrapper()
    q, k, v, out = tensors(0)
    res, call = layer_call.record(w, q, k, v, out)
    assert res is out and call is not None
    assert torch.equal(out, q * 2.0 + k.sum() - v.sum())
    q1, k1, v1, out1 = tensors(1)
    assert call(q1, k1, v1, out1) is out1
    assert torch.equal(out1, q1 * 2.0 + k1.sum() - v1.sum())
    assert w._cached_module.seen[-1][:4] == (q1, k1, v1, out1) and w._cached_module.seen[-1][4:] == (2.0, True)
    assert isinstance(w._cached_module, Module)  # the recorder is gone after the first layer


def test_a_call_that_cannot_be_recorded_keeps_every_layer_on_run(caplog, monkeypatch):
    monkeypatch.setattr(layer_call, "_said", set())  # each reason is said once a process
    for w, why in ((Wrapper(calls=2), "2 calls"), (Wrapper(pass_q_twice=True), "not one of")):
        q, k, v, out = tensors(0)
        with caplog.at_level(logging.WARNING):
            res, call = layer_call.record(w, q, k, v, out)
        assert call is None and res is out and isinstance(w._cached_module, Module)
        assert why in caplog.text


def test_a_wrapper_without_a_compiled_module_runs_plainly():
    class Plain:
        def run(self, q, kv, out=None):
            return out.copy_(q)
    q, k, v, out = tensors(0)
    res, call = layer_call.record(Plain(), q, k, v, out)
    assert call is None and torch.equal(res, q)
