"""HF config (PretrainedConfig, dict, config.json or model dir) -> the few fields our decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "ModelConfig",
    "UnsupportedArchitectureError",
    "SUPPORTED_ARCHITECTURES",
    "read_hf_config",
]

# Architecture -> how its attention is shaped. Everything else is shared (RMSNorm, SiLU
# gated MLP, rotate-half RoPE, pre-norm residual blocks).
SUPPORTED_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"model_type": "llama", "qkv_bias": None, "qk_norm": False},
    "Qwen2ForCausalLM": {"model_type": "qwen2", "qkv_bias": True, "o_bias": False, "qk_norm": False},
    "Qwen3ForCausalLM": {"model_type": "qwen3", "qkv_bias": None, "qk_norm": True},
}
_BY_MODEL_TYPE = {v["model_type"]: k for k, v in SUPPORTED_ARCHITECTURES.items()}


class UnsupportedArchitectureError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None  # {"rope_type": "llama3", "factor": ..., ...} or None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    torch_dtype: str | None = None  # the checkpoint's dtype, informational
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_hf(cls, hf_config: Any) -> "ModelConfig":
        d = read_hf_config(hf_config)
        arch = _architecture(d)
        spec = SUPPORTED_ARCHITECTURES[arch]
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedArchitectureError(f"{arch}: hidden_act {act!r} is not supported (silu only)")
        if d.get("use_sliding_window"):
            raise UnsupportedArchitectureError(f"{arch}: sliding-window attention is not supported")
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        head_dim = d.get("head_dim") or hidden // num_heads
        attention_bias = bool(d.get("attention_bias", False))
        rope_theta, rope_scaling = _rope(d)
        return cls(
            architecture=arch,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias if spec["qkv_bias"] is None else spec["qkv_bias"],
            o_bias=spec.get("o_bias", attention_bias),
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=spec["qk_norm"],
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "") or None,
        )


def read_hf_config(hf_config: Any) -> dict:
    """A plain dict from a transformers PretrainedConfig, a dict, a config.json path or a model dir."""
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    if isinstance(hf_config, (str, Path)):
        path = Path(hf_config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no HF config at {path}")
        return json.loads(path.read_text())
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    raise TypeError(f"cannot read an HF config from {type(hf_config).__name__}")


def _architecture(d: dict) -> str:
    archs = d.get("architectures") or []
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    if archs:
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"unsupported architecture {arch!r}; supported: {supported}"
            )
        return arch
    model_type = d.get("model_type")
    if model_type not in _BY_MODEL_TYPE:
        raise UnsupportedArchitectureError(
            f"unsupported model_type {model_type!r} (no 'architectures' in the config); "
            f"supported: {supported}"
        )
    return _BY_MODEL_TYPE[model_type]


def _rope(d: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers v5 ``rope_parameters`` or v4 ``rope_theta`` + ``rope_scaling``."""
    params = dict(d.get("rope_parameters") or {})
    scaling = dict(d.get("rope_scaling") or {})
    theta = params.get("rope_theta", d.get("rope_theta", scaling.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type in (None, "default"):
        return float(theta), None
    merged.pop("type", None)
    merged.pop("rope_theta", None)
    merged["rope_type"] = rope_type
    return float(theta), merged
