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

Both implement :class:`~testbed.engine.kernels.base.Ops` and register under their name in
``KERNELS``; ``engine.kernels`` picks one (``auto``: triton on CUDA, torch elsewhere). This
package imports no torch, so the simulator checks engine.kernels at config time too.
"""

from __future__ import annotations

import os

from testbed.core.registry import Registry

__all__ = ["KERNELS", "AUTO", "check_kernels", "make_ops", "resolve_kernels"]

KERNELS = Registry("engine.kernels", modules={
    "torch": "testbed.engine.kernels.torch_ops",
    "triton": "testbed.engine.kernels.triton_ops",
})
AUTO = "auto"  # not an implementation: resolve_kernels picks one for the device


def check_kernels(name: str) -> None:
    KERNELS.check(name, also=(AUTO,))


def resolve_kernels(name: str, device) -> str:
    """``auto`` -> ``triton`` on CUDA, ``torch`` elsewhere; checks that the choice can run."""
    import torch  # only an engine resolves its kernels; the names above stay torch-free

    device = torch.device(device)
    check_kernels(name)
    if name == AUTO:
        name = "triton" if device.type == "cuda" else "torch"
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"engine.kernels=triton runs on CUDA (device is {device}); use engine.kernels=torch, "
                         "or set TRITON_INTERPRET=1 to run the kernels in Triton's (slow) CPU interpreter")
    return name


def make_ops(name: str):
    """The Ops of implementation ``name`` (resolve ``auto`` first)."""
    return KERNELS.get(name).obj()
