"""Fused Triton kernels for the model's elementwise work (CUDA; or Triton's CPU interpreter
with TRITON_INTERPRET=1, for the tests).

One program per token row. Each kernel rounds to the model dtype exactly where the torch
reference (torch_ops.py) does -- after a residual add, after the normalisation and before
the weight, after RoPE, after SiLU -- so the two differ only by float32 rounding inside.
Integer arguments that vary per step (the number of tokens) are never passed: the grid
carries them, so Triton compiles each kernel once per model shape, not once per batch.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError as e:
    raise ImportError("engine.kernels=triton needs the triton package (it comes with CUDA builds of torch); "
                      "install it or use engine.kernels=torch") from e

from testbed.engine.kernels import KERNELS
from testbed.engine.kernels.base import Ops

__all__ = ["TritonOps"]


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, x_stride, res_stride, out_stride, sum_stride,
                    N, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + row * x_stride + offs, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * res_stride + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the add rounds, as torch's does
        tl.store(sum_ptr + row * sum_stride + offs, x, mask=m)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (xf * inv).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + offs, (w * y).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _norm_rope(src, h, nh, d, dm, c, s, w_ptr, eps, D: tl.constexpr, HAS_NORM: tl.constexpr):
    """Heads h (< nh) of one token at src ([heads, D]): optional RMSNorm over D, then RoPE
    on the halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). Returns the two halves."""
    HALF: tl.constexpr = D // 2
    m = (h < nh)[:, None] & dm[None, :]
    p = src + h[:, None] * D + d[None, :]
    x1 = tl.load(p, mask=m, other=0.0)
    x2 = tl.load(p + HALF, mask=m, other=0.0)
    dt = x1.dtype
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / D + eps)[:, None]
        w1 = tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        f1 = (w1 * (f1 * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        f2 = (w2 * (f2 * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    o1 = (f1 * c - f2 * s).to(dt)
    o2 = (f2 * c + f1 * s).to(dt)
    return o1, o2, m


@triton.jit
def _qkv_rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, kc_ptr, vc_ptr, loc_ptr, q_ptr,
                           qkv_stride, cs_stride, eps, H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr,
                           BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_HALF: tl.constexpr,
                           HAS_NORM: tl.constexpr):
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dm = d < HALF
    c = tl.load(cos_ptr + t * cs_stride + d, mask=dm, other=0.0)[None, :]
    s = tl.load(sin_ptr + t * cs_stride + d, mask=dm, other=0.0)[None, :]
    slot = tl.load(loc_ptr + t).to(tl.int64)
    row = qkv_ptr + t * qkv_stride
    # q -> the output
    h = tl.arange(0, BLOCK_H)
    q1, q2, qm = _norm_rope(row, h, H, d, dm, c, s, qn_ptr, eps, D, HAS_NORM)
    qo = q_ptr + t * (H * D) + h[:, None] * D + d[None, :]
    tl.store(qo, q1, mask=qm)
    tl.store(qo + HALF, q2, mask=qm)
    # k -> the KV pool at the token's slot
    kh = tl.arange(0, BLOCK_KV)
    k1, k2, km = _norm_rope(row + H * D, kh, KV, d, dm, c, s, kn_ptr, eps, D, HAS_NORM)
    ko = kc_ptr + slot * (KV * D) + kh[:, None] * D + d[None, :]
    tl.store(ko, k1.to(kc_ptr.dtype.element_ty), mask=km)
    tl.store(ko + HALF, k2.to(kc_ptr.dtype.element_ty), mask=km)
    # v -> the pool, as is
    vsrc = row + (H + KV) * D + kh[:, None] * D + d[None, :]
    vo = vc_ptr + slot * (KV * D) + kh[:, None] * D + d[None, :]
    tl.store(vo, tl.load(vsrc, mask=km, other=0.0).to(vc_ptr.dtype.element_ty), mask=km)
    tl.store(vo + HALF, tl.load(vsrc + HALF, mask=km, other=0.0).to(vc_ptr.dtype.element_ty), mask=km)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_stride, out_stride, I, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    g = tl.load(gu_ptr + t * gu_stride + offs, mask=m, other=0.0)
    u = tl.load(gu_ptr + t * gu_stride + I + offs, mask=m, other=0.0)
    gf = g.to(tl.float32)
    a = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # torch's silu, rounded before the product
    tl.store(out_ptr + t * out_stride + offs, (a.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=m)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a unit inner stride (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@KERNELS.register("triton")
class TritonOps(Ops):
    name = "triton"
    SILU_BLOCK = 1024

    def _norm(self, x, residual, weight, eps):
        xs = _rows(x)
        n = xs.shape[-1]
        out = torch.empty(xs.shape, dtype=x.dtype, device=x.device)
        if residual is None:
            rs = ss = xs
        elif residual.shape != x.shape:
            raise ValueError(f"residual of shape {tuple(residual.shape)} for x of shape {tuple(x.shape)}")
        else:
            rs = _rows(residual)
            ss = torch.empty_like(out)
        if xs.shape[0]:
            _rmsnorm_kernel[(xs.shape[0],)](
                xs, rs, weight, out, ss, xs.stride(0), rs.stride(0), out.stride(0), ss.stride(0), n, eps,
                HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n))
        return out.view(x.shape), ss.view(x.shape)

    def rmsnorm(self, x, weight, eps):
        return self._norm(x, None, weight, eps)[0]

    def add_rmsnorm(self, x, residual, weight, eps):
        return self._norm(x, residual, weight, eps)

    def qkv_rope_store(self, qkv, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps, k_cache, v_cache, loc, q_out=None):
        T = qkv.shape[0]
        D = k_cache.shape[-1]
        if D % 2 or qkv.shape[-1] != (num_heads + 2 * num_kv_heads) * D:
            raise ValueError(f"qkv of width {qkv.shape[-1]} does not hold {num_heads} q and 2 x {num_kv_heads} "
                             f"kv heads of (even) head_dim {D}")
        qkv = _rows(qkv)
        if q_out is None:
            q = torch.empty((T, num_heads, D), dtype=qkv.dtype, device=qkv.device)
        elif q_out.shape != (T, num_heads, D) or not q_out.is_contiguous():
            raise ValueError(f"q_out of shape {tuple(q_out.shape)} for q of shape {(T, num_heads, D)} (contiguous)")
        else:
            q = q_out
        if T:
            has_norm = q_norm is not None
            _qkv_rope_store_kernel[(T,)](
                qkv, cos, sin, q_norm if has_norm else qkv, k_norm if has_norm else qkv, k_cache, v_cache, loc, q,
                qkv.stride(0), cos.stride(0), eps, H=num_heads, KV=num_kv_heads, D=D,
                BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_KV=triton.next_power_of_2(num_kv_heads),
                BLOCK_HALF=triton.next_power_of_2(D // 2), HAS_NORM=has_norm)
        return q

    def silu_mul(self, gate_up):
        gu = _rows(gate_up)
        inter = gu.shape[-1] // 2
        out = torch.empty((gu.shape[0], inter), dtype=gu.dtype, device=gu.device)
        if gu.shape[0]:
            _silu_mul_kernel[(gu.shape[0], triton.cdiv(inter, self.SILU_BLOCK))](
                gu, out, gu.stride(0), out.stride(0), inter, BLOCK=self.SILU_BLOCK)
        return out.view(*gate_up.shape[:-1], inter)
