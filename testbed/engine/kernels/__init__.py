"""The model's elementwise operations, as one set of functions per implementation.

    ops = make_ops(resolve_kernels("auto", device))
    y, residual = ops.add_rmsnorm(x, residual, weight, eps)

- ``torch``: plain torch ops, the reference (runs anywhere; what the CPU engine uses);
- ``triton``: fused Triton kernels for CUDA: residual add + RMSNorm in one kernel; q/k
  RMSNorm + RoPE + the K/V store into the paged pool in one kernel; SiLU * up in one kernel.
  A decode step then launches ~9 kernels a layer instead of ~50, which is most of the
  step's CPU cost (graph launch, eager launches) and a good part of its GPU time at small
  batches. Each fused kernel rounds to the model dtype where the reference does, so the two
  agree to the rounding of bf16 (tests/test_kernels.py runs them under Triton's CPU
  interpreter, ``TRITON_INTERPRET=1``).

Both implement :class:`Ops`; ``engine.kernels`` picks one (``auto``: triton on CUDA, torch
elsewhere).
"""

from __future__ import annotations

import os

import torch

from testbed.engine.kernels.base import Ops
from testbed.engine.options import KERNELS

__all__ = ["Ops", "make_ops", "resolve_kernels", "KERNELS"]


def resolve_kernels(name: str, device: torch.device | str) -> str:
    """``auto`` -> ``triton`` on CUDA, ``torch`` elsewhere; checks that the choice can run."""
    device = torch.device(device)
    if name not in KERNELS:
        raise ValueError(f"engine.kernels={name!r} is invalid; allowed: {', '.join(KERNELS)}")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"engine.kernels=triton runs on CUDA (device is {device}); use engine.kernels=torch, "
                         "or set TRITON_INTERPRET=1 to run the kernels in Triton's (slow) CPU interpreter")
    return name


def make_ops(name: str) -> Ops:
    if name == "torch":
        from testbed.engine.kernels.torch_ops import TorchOps
        return TorchOps()
    if name == "triton":
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise ImportError("engine.kernels=triton needs the triton package (it comes with CUDA builds of "
                              "torch); install it or use engine.kernels=torch") from e
        from testbed.engine.kernels.triton_ops import TritonOps
        return TritonOps()
    raise ValueError(f"unknown kernels {name!r}; known: torch, triton")
