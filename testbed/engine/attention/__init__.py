"""Attention backends over the paged KV pool, chosen by name.

    backend = make_attention_backend("torch", num_qo_heads=32, num_kv_heads=8, head_dim=128,
                                     dtype=torch.bfloat16, device="cuda")

Adding one: subclass :class:`AttentionBackend` and list it in ``_BACKENDS``
("name" -> "module:Class", imported only when asked for).
"""

from __future__ import annotations

import importlib

from testbed.engine.attention.base import AttentionBackend
from testbed.engine.attention.kv_pool import KVPool

__all__ = ["AttentionBackend", "KVPool", "make_attention_backend", "attention_backend_names"]

_BACKENDS: dict[str, str] = {
    "torch": "testbed.engine.attention.torch_backend:TorchAttentionBackend",
    "flashinfer": "testbed.engine.attention.flashinfer_backend:FlashInferAttentionBackend",
}


def attention_backend_names() -> list[str]:
    return sorted(_BACKENDS)


def make_attention_backend(name: str, **kwargs) -> AttentionBackend:
    """Build the backend called ``name``; kwargs go to its constructor
    (num_qo_heads, num_kv_heads, head_dim, dtype, device, sm_scale=None, ...)."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; known: {', '.join(attention_backend_names())}"
        ) from None
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(**kwargs)
