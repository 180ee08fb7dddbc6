"""Decoder LLMs (Llama 2/3/3.1, Qwen2, Qwen3) over the paged KV cache, shaped by a ModelSpec.

    model = build_model(spec, torch.bfloat16, "cuda", "flashinfer")   # or a config dict / path
    load_weights(model, "/path/to/hf_dir")      # or "dummy"
    pool = model.create_kv_pool(num_slots=..., page_size=1)
    logits = model(forward_batch)               # float32 [B, vocab]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch

from testbed.engine.attention import make_attention_backend
from testbed.engine.attention.base import AttentionBackend
from testbed.engine.kernels import make_ops, resolve_kernels
from testbed.engine.model.decoder import CausalLM, DecoderLayer
from testbed.engine.model.parallel import TensorParallel
from testbed.modelspec import SUPPORTED_ARCHITECTURES, ModelSpec, UnsupportedArchitectureError, load_model_spec

__all__ = [
    "build_model",
    "load_weights",
    "load_model",
    "CausalLM",
    "DecoderLayer",
    "TensorParallel",
    "SUPPORTED_ARCHITECTURES",
    "UnsupportedArchitectureError",
    "model_spec_of",
]


def model_spec_of(source: Any) -> ModelSpec:
    """The shape to build: a ModelSpec as given; an HF config (a dict, a transformers
    PretrainedConfig), a config.json or a model dir read by ModelSpec."""
    if isinstance(source, ModelSpec):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_model_spec(source)
    if hasattr(source, "to_dict"):  # transformers PretrainedConfig
        source = source.to_dict()
    if isinstance(source, Mapping):
        return ModelSpec.from_hf_config(source)
    raise TypeError(f"cannot read a model shape from a {type(source).__name__}; "
                    f"allowed: ModelSpec, HF config dict or PretrainedConfig, config.json path, model dir")


def _dtype(dtype: torch.dtype | str, spec: ModelSpec) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = spec.dtype if dtype == "auto" else dtype.replace("torch.", "")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def build_model(
    source: Any,
    dtype: torch.dtype | str = torch.bfloat16,
    device: torch.device | str = "cpu",
    attention_backend: str | AttentionBackend = "torch",
    tp_rank: int = 0,
    tp_size: int = 1,
    tp_group: Any = None,
    kernels: str = "auto",
    attention_options: dict | None = None,
) -> CausalLM:
    """An (uninitialised) model of ``source``'s shape (see ``model_spec_of``).

    ``attention_backend`` is a backend name ("torch", "flashinfer") or a ready instance;
    ``kernels`` the elementwise ops ("torch", "triton", "auto": triton on CUDA);
    ``attention_options`` more keyword arguments for the named backend's constructor.
    Under tensor parallelism (tp_size > 1, torch.distributed initialised) each rank builds
    its shard; weights are sliced at load time.
    """
    spec = model_spec_of(source)
    dtype = _dtype(dtype, spec)
    tp = TensorParallel(tp_rank, tp_size, tp_group)
    if isinstance(attention_backend, str):
        heads = tp.divide(spec.num_q_heads, "num_attention_heads")
        attention_backend = make_attention_backend(
            attention_backend,
            num_qo_heads=heads,
            num_kv_heads=spec.kv_heads_per_rank(tp_size),
            head_dim=spec.head_dim,
            dtype=dtype,
            device=device,
            **(attention_options or {}),
        )
    return CausalLM(spec, attention_backend, tp, dtype, device, make_ops(resolve_kernels(kernels, device)))


def load_weights(model: CausalLM, path_or_dummy: str | Path, *, seed: int = 0, dummy_std: float = 0.02):
    """Weights from a HF safetensors dir, or seeded random ones ("dummy"). Returns a LoadReport."""
    from testbed.engine.weights import load_weights as _load

    return _load(model, path_or_dummy, seed=seed, dummy_std=dummy_std)


def load_model(
    path: str | Path,
    dtype: torch.dtype | str = "auto",
    device: torch.device | str = "cpu",
    attention_backend: str | AttentionBackend = "torch",
    tp_rank: int = 0,
    tp_size: int = 1,
    tp_group: Any = None,
) -> CausalLM:
    """build_model from ``path``/config.json, then load_weights from ``path``."""
    model = build_model(path, dtype, device, attention_backend, tp_rank, tp_size, tp_group)
    load_weights(model, path)
    return model
