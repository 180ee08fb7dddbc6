"""Attention backends over the paged KV pool, chosen by name (engine.attention).

    backend = make_attention_backend("torch", num_qo_heads=32, num_kv_heads=8, head_dim=128,
                                     dtype=torch.bfloat16, device="cuda")

Adding one: subclass :class:`~testbed.engine.attention.base.AttentionBackend` in a module
here, decorate it with ``@ATTENTION_BACKENDS.register("<name>")`` and name that module in
``ATTENTION_BACKENDS`` below (imported only when the name is asked for). This package
imports no torch, so the names are checked at config time by the simulator too.
"""

from __future__ import annotations

from testbed.core.registry import Registry

__all__ = ["ATTENTION_BACKENDS", "make_attention_backend"]

ATTENTION_BACKENDS = Registry("engine.attention", modules={
    "torch": "testbed.engine.attention.torch_backend",
    "flashinfer": "testbed.engine.attention.flashinfer_backend",
})


def make_attention_backend(name: str, **kwargs):
    """Build the backend called ``name``; kwargs go to its constructor
    (num_qo_heads, num_kv_heads, head_dim, dtype, device, sm_scale=None, ...)."""
    return ATTENTION_BACKENDS.get(name).obj(**kwargs)
