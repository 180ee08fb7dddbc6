"""Sampling: greedy, temperature, top-k, top-p, per-request seeds, mixed batches."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from testbed.engine.sampling import Sampler, SamplingTensors, sample, uniform_noise  # noqa: E402


def _logits(b=6, v=50, seed=0):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3


def _st(n, **kw):
    kw.setdefault("temperature", [1.0] * n)
    return SamplingTensors.build(**kw)


def test_greedy_is_argmax():
    logits = _logits()
    st = _st(6, temperature=[0.0] * 6, top_k=[5] * 6, top_p=[0.5] * 6, seed=list(range(6)))
    assert st.all_greedy
    assert torch.equal(sample(logits, st), logits.argmax(-1))


def test_top_k_1_is_greedy():
    logits = _logits(b=20)
    st = _st(20, temperature=[0.7] * 20, top_k=[1] * 20, seed=list(range(20)))
    assert torch.equal(sample(logits, st), logits.argmax(-1))


def test_same_seed_same_tokens_whatever_the_batch():
    logits = _logits(b=8)
    st = _st(8, temperature=[1.0] * 8, seed=[7, 8, 9, 10, 11, 12, 13, 14], step=[3] * 8)
    first = sample(logits, st)
    assert torch.equal(first, sample(logits, st))
    # row 2 alone, and in a reversed batch: same token
    alone = sample(logits[2:3], _st(1, seed=[9], step=[3]))
    assert alone.item() == first[2].item()
    rev = sample(logits.flip(0), _st(8, seed=[14, 13, 12, 11, 10, 9, 8, 7], step=[3] * 8))
    assert torch.equal(rev.flip(0), first)


def test_different_seeds_and_steps_differ():
    logits = torch.zeros(200, 100)  # uniform distribution
    a = sample(logits, _st(200, seed=list(range(200))))
    b = sample(logits, _st(200, seed=list(range(200)), step=[1] * 200))
    assert len(set(a.tolist())) > 50
    assert (a != b).float().mean() > 0.9


def test_temperature_matches_softmax_distribution():
    n = 4000
    base = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])
    temp = 1.5
    tokens = sample(base.expand(n, -1), _st(n, temperature=[temp] * n, seed=list(range(n))))
    freq = torch.bincount(tokens, minlength=5).float() / n
    want = torch.softmax(base / temp, -1)
    assert (freq - want).abs().max() < 0.03


def test_top_p_restricts_support():
    n = 1000
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])
    logits = probs.log().expand(n, -1)
    tokens = sample(logits, _st(n, top_p=[0.75] * n, seed=list(range(n))))
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 is the smallest prefix with mass >= 0.75
    freq0 = (tokens == 0).float().mean().item()
    assert abs(freq0 - 0.5 / 0.8) < 0.05  # renormalised inside the nucleus
    tiny = sample(logits, _st(n, top_p=[1e-6] * n, seed=list(range(n))))
    assert set(tiny.tolist()) == {0}


def test_top_k_restricts_support():
    n = 500
    logits = torch.linspace(3, -3, 40).expand(n, -1)
    tokens = sample(logits, _st(n, temperature=[5.0] * n, top_k=[3] * n, seed=list(range(n))))
    assert set(tokens.tolist()) == {0, 1, 2}


def test_mixed_parameters_in_one_batch():
    v = 30
    logits = _logits(b=5, v=v, seed=4)
    params = dict(
        temperature=[0.0, 1.0, 0.8, 1.2, 1.0],
        top_k=[0, 0, 4, 0, 2],
        top_p=[1.0, 1.0, 1.0, 0.6, 0.9],
        seed=[1, 2, 3, 4, 5],
        step=[0, 1, 2, 3, 4],
    )
    batched = sample(logits, SamplingTensors.build(**params))
    assert batched[0].item() == logits[0].argmax().item()
    for i in range(5):  # each row as if it were alone
        alone = SamplingTensors.build(**{k: [vals[i]] for k, vals in params.items()})
        assert sample(logits[i : i + 1], alone).item() == batched[i].item()
    assert batched[2].item() in logits[2].topk(4).indices.tolist()
    assert batched[4].item() in logits[4].topk(2).indices.tolist()
    # row 3: inside its nucleus under temperature 1.2
    p = torch.softmax(logits[3] / 1.2, -1)
    order = p.argsort(descending=True)
    keep = (p[order].cumsum(0) - p[order]) < 0.6
    assert batched[3].item() in order[keep].tolist()


def test_unseeded_requests_follow_the_sampler_seed():
    logits = torch.zeros(16, 64)
    a = Sampler(seed=5)
    b = Sampler(seed=5)
    ta = a(logits, a.tensors([1.0] * 16))
    tb = b(logits, b.tensors([1.0] * 16))
    assert torch.equal(ta, tb)
    assert not torch.equal(ta, a(logits, a.tensors([1.0] * 16)))  # fresh draws next call


def test_uniform_noise_is_in_open_interval_and_flat():
    u = uniform_noise(torch.arange(64), torch.zeros(64, dtype=torch.long), 4096)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.005
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (hist - 0.1).abs().max() < 0.005
