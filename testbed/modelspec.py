"""Model shape from a Hugging Face ``config.json``: the one reader of it.

``ModelSpec`` is the one description of a decoder-only transformer: the cost models (FLOPs
and bytes per step), the KV sizing of both backends (``kv_bytes_per_token``) and the engine's
model (layer shapes, RoPE, biases) all read it. It is built from the plain dict of an HF
``config.json``::

    spec = load_model_spec("hf/llama3_8b.json")          # resolved against conf/model/
    spec = load_model_spec("/models/Qwen3-8B")            # a model dir: its config.json
    spec = ModelSpec.from_hf_config(json.load(f), source="x.json")
    spec = model_spec_from_cfg(cfg.model)                 # the Hydra ``model`` group node

Supported architectures: ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``
(dense, pre-norm RMSNorm, SiLU-gated MLP, rotary attention with grouped-query heads).

Path resolution of ``load_model_spec(path)``:
  1. an absolute path is used as given;
  2. a relative path is looked up first under ``<repo>/conf/model/`` (so the Hydra group
     files can say ``config_path: hf/llama3_8b.json``), then against the current working
     directory (so ``model.config_path=my/config.json`` on the command line works);
  3. a directory means ``<dir>/config.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "CONF_MODEL_DIR",
    "UnsupportedArchitectureError",
    "ModelSpec",
    "ModelConfig",
    "load_model_spec",
    "model_spec_from_cfg",
    "resolve_config_path",
    "check_tp_split",
    "tp_split_problems",
]

#: Architecture -> what its HF config leaves implicit. ``model_type`` names it in configs
#: without ``architectures`` (a transformers config built in code). ``qkv_bias`` / ``o_bias``:
#: None = the config's ``attention_bias`` (Llama, Qwen3: HF puts it on q, k, v and o); Qwen2
#: always has a q/k/v bias and none on o (its config has no key for it). ``qk_norm``: Qwen3
#: applies an RMSNorm over head_dim to q and k before RoPE.
SUPPORTED_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"model_type": "llama", "qkv_bias": None, "o_bias": None, "qk_norm": False},
    "Qwen2ForCausalLM": {"model_type": "qwen2", "qkv_bias": True, "o_bias": False, "qk_norm": False},
    "Qwen3ForCausalLM": {"model_type": "qwen3", "qkv_bias": None, "o_bias": None, "qk_norm": True},
}
_BY_MODEL_TYPE = {v["model_type"]: k for k, v in SUPPORTED_ARCHITECTURES.items()}

#: Where relative ``config_path`` values of the Hydra model group are resolved first.
CONF_MODEL_DIR = Path(__file__).resolve().parent.parent / "conf" / "model"

#: torch_dtype spellings -> the torch dtype name (what ``engine.dtype=auto`` loads).
_DTYPE_NAMES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "half": "float16", "fp16": "float16",
    "float32": "float32", "float": "float32", "fp32": "float32",
}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class UnsupportedArchitectureError(ValueError):
    """A config of a model the testbed cannot model or run (architecture, activation, attention)."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense decoder-only transformer; the per-rank sizes under tensor parallelism
    come from ``kv_heads_per_rank`` / ``kv_bytes_per_token``.

    ``attention_bias`` is the bias on q, k and v, ``o_bias`` the one on the output
    projection. ``dtype`` is the checkpoint's torch dtype name. ``eos_token_ids`` is a tuple
    (the spec is immutable); ``rope_scaling`` is None or a dict with ``rope_type`` and must
    not be mutated.
    """

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, compare=False)
    rms_norm_eps: float = 1e-6
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    dtype: str = "bfloat16"
    name: str | None = None
    source: str | None = field(default=None, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], *, name: str | None = None, source: str | None = None
    ) -> "ModelSpec":
        """Build a spec from the dict of an HF ``config.json`` (or a transformers config's ``to_dict()``).

        ``source`` (the file name) is only used in error messages and kept for reference.
        """
        where = source or "<config dict>"

        def req(key: str) -> Any:
            if key not in config or config[key] is None:
                raise ValueError(f"model config {where}: required field {key!r} is missing")
            return config[key]

        def pos_int(key: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"model config {where}: field {key!r}={value!r} must be a positive integer"
                )
            return value

        arch = _architecture(config, where)
        arch_defaults = SUPPORTED_ARCHITECTURES[arch]
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedArchitectureError(
                f"model config {where}: hidden_act={act!r} is not supported; allowed: silu")
        if config.get("use_sliding_window"):
            raise UnsupportedArchitectureError(
                f"model config {where}: use_sliding_window=true is not supported (full attention only)")

        hidden = pos_int("hidden_size", req("hidden_size"))
        inter = pos_int("intermediate_size", req("intermediate_size"))
        layers = pos_int("num_hidden_layers", req("num_hidden_layers"))
        q_heads = pos_int("num_attention_heads", req("num_attention_heads"))
        kv_heads = config.get("num_key_value_heads")
        kv_heads = q_heads if kv_heads is None else pos_int("num_key_value_heads", kv_heads)
        if q_heads % kv_heads:
            raise ValueError(
                f"model config {where}: num_attention_heads={q_heads} is not a multiple of "
                f"num_key_value_heads={kv_heads}"
            )
        head_dim = config.get("head_dim")
        if head_dim is None:
            if hidden % q_heads:
                raise ValueError(
                    f"model config {where}: no 'head_dim' and hidden_size={hidden} is not "
                    f"divisible by num_attention_heads={q_heads}"
                )
            head_dim = hidden // q_heads
        head_dim = pos_int("head_dim", head_dim)
        vocab = pos_int("vocab_size", req("vocab_size"))
        max_ctx = pos_int("max_position_embeddings", req("max_position_embeddings"))

        eos = config.get("eos_token_id")
        if eos is None:
            eos_ids: tuple[int, ...] = ()
        elif isinstance(eos, int) and not isinstance(eos, bool):
            eos_ids = (eos,)
        elif isinstance(eos, (list, tuple)) and all(
            isinstance(e, int) and not isinstance(e, bool) for e in eos
        ):
            eos_ids = tuple(eos)
        else:
            raise ValueError(
                f"model config {where}: eos_token_id={eos!r} must be an int or a list of ints"
            )

        rope_theta, rope_scaling = _rope(config, where)
        attention_bias = bool(config.get("attention_bias") or False)
        qkv_bias, o_bias = arch_defaults["qkv_bias"], arch_defaults["o_bias"]

        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_q_heads=q_heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            max_context=max_ctx,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=arch_defaults["qk_norm"],
            attention_bias=attention_bias if qkv_bias is None else qkv_bias,
            o_bias=attention_bias if o_bias is None else o_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            eos_token_ids=eos_ids,
            bos_token_id=config.get("bos_token_id"),
            dtype=_dtype_name(config, where),
            name=name,
            source=source,
        )

    # ------------------------------------------------------------------ derived shapes
    @property
    def dtype_bytes(self) -> int:
        """Bytes of one weight (and, by default, one KV element) in the checkpoint's dtype."""
        return _DTYPE_BYTES[self.dtype]

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (num_q_heads * head_dim)."""
        return self.num_q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection output (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    def layer_linear_params(self) -> int:
        """Weights (and biases) of the matmuls of one decoder layer: q, k, v, o, gate, up, down."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            attn += h
        mlp = 3 * h * i
        if self.mlp_bias:
            mlp += 2 * i + h
        return attn + mlp

    def layer_norm_params(self) -> int:
        """Norm weights of one decoder layer: two RMSNorms, plus q/k norms for Qwen3."""
        n = 2 * self.hidden_size
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        """Output projection weights; counted in param_count() only when untied."""
        return self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        """Exact parameter count, as ``sum(p.numel() for p in model.parameters())``."""
        n = self.embedding_params()
        n += self.num_layers * (self.layer_linear_params() + self.layer_norm_params())
        n += self.hidden_size  # final norm
        if not self.tie_word_embeddings:
            n += self.lm_head_params()
        return n

    def non_embedding_param_count(self) -> int:
        """Parameters other than the embedding table and (untied) lm head."""
        n = self.param_count() - self.embedding_params()
        if not self.tie_word_embeddings:
            n -= self.lm_head_params()
        return n

    def weight_bytes(self) -> int:
        """Bytes of all weights in the model's dtype (tied embeddings stored once)."""
        return self.param_count() * self.dtype_bytes

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads one of ``tp`` ranks holds: an even split, or one (replicated) head when
        there are fewer KV heads than ranks, as the engine's QKV layer shards them."""
        return self.num_kv_heads // tp if self.num_kv_heads >= tp else 1

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token takes on one of ``tp`` ranks, over all layers (K and V).
        ``dtype_bytes``: the KV cache's element size when it is not the checkpoint's (the
        engine's ``engine.dtype``)."""
        itemsize = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * itemsize


def _architecture(config: Mapping[str, Any], where: str) -> str:
    """The supported architecture a config names: ``architectures[0]``, else its ``model_type``."""
    archs = config.get("architectures")
    if isinstance(archs, str):
        archs = [archs]
    supported = sorted(SUPPORTED_ARCHITECTURES)
    if archs:
        if archs[0] not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"model config {where}: architecture {archs[0]!r} is not supported; supported: {supported}")
        return archs[0]
    model_type = config.get("model_type")
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    raise ValueError(f"model config {where}: required field 'architectures' is missing and model_type "
                     f"{model_type!r} names none of the supported {supported}")


def _rope(config: Mapping[str, Any], where: str) -> tuple[float, dict | None]:
    """(theta, scaling): transformers 5 writes both into ``rope_parameters``, older configs
    ``rope_theta`` and ``rope_scaling`` (whose ``type`` is the old name of ``rope_type``).
    Scaling is None for plain RoPE."""
    params, scaling = config.get("rope_parameters"), config.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"model config {where}: {key}={value!r} must be a dict or null")
    params, scaling = dict(params or {}), dict(scaling or {})
    thetas = (params.get("rope_theta"), config.get("rope_theta"), scaling.get("rope_theta"), 10000.0)
    merged = {**scaling, **params}
    theta = float(next(t for t in thetas if t is not None))
    old_name = merged.pop("type", "default")
    rope_type = merged.pop("rope_type", old_name)
    merged.pop("rope_theta", None)
    if rope_type in (None, "default"):
        return theta, None
    return theta, {**merged, "rope_type": rope_type}


def _dtype_name(config: Mapping[str, Any], where: str) -> str:
    """The checkpoint's torch dtype name; bfloat16 when the config leaves it open."""
    name = config.get("torch_dtype") or config.get("dtype")  # transformers 5: dtype
    if name is None or name == "auto":
        return "bfloat16"
    key = str(name).lower().removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise ValueError(f"model config {where}: torch_dtype={name!r} is not supported; "
                         f"supported: {sorted(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[key]


# ---------------------------------------------------------------------- loading
def resolve_config_path(path: str | os.PathLike) -> Path:
    """Resolve a model ``config_path`` (see the module docstring for the order)."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if p.is_absolute():
        candidates = [p]
    else:
        candidates = [CONF_MODEL_DIR / p, Path.cwd() / p]
    for c in candidates:
        if c.is_dir():
            c = c / "config.json"
        if c.is_file():
            return c
    raise FileNotFoundError(
        f"model config {os.fspath(path)!r} not found; looked at: "
        + ", ".join(str(c) for c in candidates)
    )


def load_model_spec(path: str | os.PathLike, *, name: str | None = None) -> ModelSpec:
    """Load an HF ``config.json`` (or a model dir holding one) into a ``ModelSpec``."""
    resolved = resolve_config_path(path)
    try:
        with open(resolved, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {resolved}: not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"model config {resolved}: expected a JSON object at the top level")
    return ModelSpec.from_hf_config(config, name=name, source=str(resolved))


_WEIGHTS_CHOICES = ("real", "dummy")


@dataclass
class ModelConfig:
    """Structured config of the Hydra ``model`` group (conf/model/<name>.yaml).

    ``config_path``: the HF config.json (resolved as in ``load_model_spec``).
    ``path``: a model directory with weights, for the GPU engine (None in simulation).
    ``weights``: ``real`` loads the checkpoint; ``dummy`` initialises random weights of the
    right shape (engine timing runs without a download).
    """

    name: str  # the model's name (its conf/model/<name>.yaml)
    config_path: str  # its HF config.json (the shape the simulator and the engine use)
    path: str | None = None  # engine: a directory with its safetensors weights and tokenizer
    weights: str = "real"  # engine: real (from path) | dummy (random weights of the right shape)

    def __post_init__(self) -> None:
        if self.weights not in _WEIGHTS_CHOICES:
            raise ValueError(
                f"model.weights={self.weights!r} is invalid; allowed: {list(_WEIGHTS_CHOICES)}"
            )
        if not self.config_path:
            raise ValueError(f"model.config_path={self.config_path!r} is invalid; allowed: a path")


def model_spec_from_cfg(cfg: Any) -> ModelSpec:
    """Build the spec from the Hydra ``model`` node (a DictConfig, dict or ModelConfig)."""
    if isinstance(cfg, ModelConfig):
        mc = cfg
    else:
        allowed = ["name", "config_path", "path", "weights"]
        if hasattr(cfg, "keys"):
            get = cfg.get
            unknown = sorted(set(cfg.keys()) - set(allowed))
            if unknown:
                raise ValueError(f"model: unknown key(s) {unknown}; allowed: {allowed}")
        else:
            def get(k, d=None):
                return getattr(cfg, k, d)
        if get("config_path") is None:
            raise ValueError("model.config_path is missing; allowed: a path to an HF config.json")
        mc = ModelConfig(
            name=str(get("name") or ""),
            config_path=str(get("config_path")),
            path=get("path"),
            weights=str(get("weights", "real")),
        )
    return load_model_spec(mc.config_path, name=mc.name or None)


def tp_split_problems(spec: ModelSpec, tp: int) -> list[str]:
    """What keeps `tp` ranks from splitting the model: query heads and the MLP split evenly;
    KV heads split evenly, or are replicated when they divide tp. Empty when it splits."""
    bad = []
    if spec.num_q_heads % tp:
        bad.append(f"num_attention_heads {spec.num_q_heads}")
    if spec.intermediate_size % tp:
        bad.append(f"intermediate_size {spec.intermediate_size}")
    kv = spec.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        bad.append(f"num_key_value_heads {kv}")
    return bad


def check_tp_split(spec: ModelSpec, tp: int) -> None:
    """engine.tp splits the model, checked before any rank starts: one line naming what does
    not divide."""
    bad = tp_split_problems(spec, tp)
    if bad:
        raise ValueError(f"engine.tp={tp} cannot split {spec.name or spec.architecture} evenly: {', '.join(bad)} "
                         f"(query heads and the MLP width must be divisible by engine.tp; KV heads divisible by "
                         f"it or dividing it)")
