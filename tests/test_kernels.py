"""The fused Triton kernels (testbed/engine/kernels/triton_ops.py) against the torch
reference ops, under Triton's CPU interpreter here (tests/conftest.py) and on the GPU where
one is present (benchmarks/check_backends.py compares them there in bf16 too).

float32: equal to float32 rounding. bf16: within one bf16 step (here the results are bit
equal; on the GPU, fused multiply-adds may move a rounding).
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from testbed.engine.kernels import make_ops, resolve_kernels  # noqa: E402

REF, FUSED = make_ops("torch"), make_ops("triton")
DTYPES = [torch.float32, torch.bfloat16]


def close(a: torch.Tensor, b: torch.Tensor, dtype) -> None:
    a, b = a.float(), b.float()
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
    else:  # one bf16 step (2^-7 relative) of the larger value (tests/conftest.py rounds as the GPU)
        assert ((a - b).abs() <= a.abs().maximum(b.abs()) * 2**-7 + 1e-6).all(), (a - b).abs().max()


def rope_tables(positions: torch.Tensor, head_dim: int):
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    f = positions.float()[:, None] * inv[None, :]
    return f.cos(), f.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96])
def test_rmsnorm_and_fused_residual_add(dtype, hidden):
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(7, hidden, generator=g).to(dtype)
    r = (3 * torch.randn(7, hidden, generator=g)).to(dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    close(REF.rmsnorm(x, w, 1e-6), FUSED.rmsnorm(x, w, 1e-6), dtype)
    (y_ref, s_ref), (y, s) = REF.add_rmsnorm(x, r, w, 1e-5), FUSED.add_rmsnorm(x, r, w, 1e-5)
    close(s_ref, s, dtype)
    close(y_ref, y, dtype)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == x.shape
    # a strided view of rows (the last-token gather is one) works as well
    close(REF.rmsnorm(x[::2], w, 1e-6), FUSED.rmsnorm(x[::2], w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,qk_norm", [
    (4, 2, 16, True),  # Qwen3-like: per-head q/k norm
    (9, 3, 64, False),  # SmolLM2's heads (not powers of two)
    (6, 1, 10, True),  # head_dim whose half is not a power of two
])
def test_qkv_rope_store(dtype, heads, kv_heads, head_dim, qk_norm):
    g = torch.Generator().manual_seed(heads * head_dim)
    T, slots = 5, 32
    qkv = torch.randn(T, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    cos, sin = rope_tables(torch.tensor([0, 1, 17, 300, 4095]), head_dim)
    qn = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if qk_norm else None
    kn = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if qk_norm else None
    loc = torch.tensor([3, 30, 0, 12, 13], dtype=torch.int32)
    caches = [[torch.zeros(slots, kv_heads, head_dim, dtype=dtype) for _ in range(2)] for _ in range(2)]
    q_ref = REF.qkv_rope_store(qkv, cos, sin, heads, kv_heads, qn, kn, 1e-6, *caches[0], loc)
    q = FUSED.qkv_rope_store(qkv, cos, sin, heads, kv_heads, qn, kn, 1e-6, *caches[1], loc)
    close(q_ref, q, dtype)
    (k_ref, v_ref), (k, v) = caches
    close(k_ref, k, dtype)
    assert torch.equal(v_ref, v)  # v is stored as it is
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[loc.long()] = False
    assert not k[untouched].any() and not v[untouched].any()  # nothing written outside loc
    assert k[loc.long()].abs().sum() > 0
    # position 0 rotates by nothing: q there is q (normed) as it came
    if not qk_norm:
        assert torch.equal(q[0], qkv[0, : heads * head_dim].view(heads, head_dim))


def test_qkv_rope_store_checks_widths():
    qkv = torch.zeros(2, 5 * 16)
    cache = torch.zeros(4, 1, 16)
    with pytest.raises(ValueError, match="does not hold 4 q and 2 x 1 kv heads"):
        FUSED.qkv_rope_store(qkv, *rope_tables(torch.arange(2), 16), 4, 1, None, None, 1e-6, cache, cache,
                             torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [128, 1500])  # 1500: not a multiple of the kernel's block
def test_silu_mul(dtype, inter):
    g = torch.Generator().manual_seed(inter)
    gu = (4 * torch.randn(6, 2 * inter, generator=g)).to(dtype)
    out = FUSED.silu_mul(gu)
    assert out.shape == (6, inter)
    close(REF.silu_mul(gu), out, dtype)


def test_empty_batches():
    w = torch.ones(8)
    assert FUSED.rmsnorm(torch.zeros(0, 8), w, 1e-6).shape == (0, 8)
    assert FUSED.silu_mul(torch.zeros(0, 8)).shape == (0, 4)


def test_resolve_kernels(monkeypatch):
    assert resolve_kernels("auto", "cpu") == "torch"
    assert resolve_kernels("auto", "cuda") == "triton"
    assert resolve_kernels("torch", "cuda") == "torch"
    with pytest.raises(ValueError, match="engine.kernels='fused' is unknown; allowed: auto, torch, triton"):
        resolve_kernels("fused", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="engine.kernels=triton runs on CUDA"):
        resolve_kernels("triton", "cpu")
