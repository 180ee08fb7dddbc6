"""Pre-norm decoder layer and the causal LM around a stack of them."""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.nn as nn

from testbed.engine.attention.base import AttentionBackend
from testbed.engine.attention.kv_pool import KVPool
from testbed.engine.forward_batch import ForwardBatch
from testbed.engine.kernels import make_ops
from testbed.engine.kernels.base import Ops
from testbed.engine.model.attention import SelfAttention
from testbed.engine.model.mlp import GatedMLP
from testbed.engine.model.norm import RMSNorm
from testbed.engine.model.parallel import ParallelLMHead, TensorParallel, VocabParallelEmbedding
from testbed.engine.model.rotary import RotaryEmbedding
from testbed.modelspec import ModelSpec

__all__ = ["DecoderLayer", "CausalLM", "WeightTarget"]

# (module that loads it, its shard id, the full HF shape it expects)
WeightTarget = tuple[nn.Module, Any, tuple[int, ...]]


class DecoderLayer(nn.Module):
    """h = x + attn(norm(x)); out = h + mlp(norm(h)).

    The residual stream is carried beside the layer's output and each add is fused into the
    next norm: ``forward(x, residual)`` takes the previous layer's mlp output and the stream
    before it (None at the first layer) and returns the same pair."""

    def __init__(self, cfg: ModelSpec, layer_id: int, tp: TensorParallel, ops: Ops, dtype, device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype, device)
        self.self_attn = SelfAttention(cfg, layer_id, tp, ops, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype, device)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp, ops, dtype, device)

    def before_attention(self, x, residual, rope, pool, loc, q_out=None):
        """-> (q, residual): the input norm (with the previous layer's residual add) and the
        attention's projection, K/V stored at ``loc``."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add(x, residual)
        return self.self_attn.project(h, rope, pool, loc, q_out), residual

    def after_attention(self, o, residual):
        """-> (mlp output, residual): output projection, residual add + norm, MLP."""
        h, residual = self.post_attention_layernorm.add(self.self_attn.output(o), residual)
        return self.mlp(h), residual

    def forward(self, x, residual, rope, fb: ForwardBatch, backend: AttentionBackend):
        q, residual = self.before_attention(x, residual, rope, backend.pool, fb.out_cache_loc)
        return self.after_attention(backend.attend(self.self_attn.layer_id, q, fb), residual)


class CausalLM(nn.Module):
    """Decoder-only LM over the paged KV cache. ``forward(fb)`` -> logits [B, vocab] (model dtype)
    of each request's last new token. Not upcast here: greedy argmax is the same on the
    exact float32 copy, and the sampler upcasts only when it samples."""

    def __init__(
        self,
        cfg: ModelSpec,
        backend: AttentionBackend,
        tp: TensorParallel,
        dtype: torch.dtype,
        device: torch.device | str,
        ops: Ops | None = None,
    ) -> None:
        super().__init__()
        self.config, self.tp, self.dtype, self.device = cfg, tp, dtype, torch.device(device)
        self.ops = ops = ops if ops is not None else make_ops("torch")
        self.attn_backend = backend
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype, device)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, device)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, tp, ops, dtype, device) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype, device)
        self.lm_head = ParallelLMHead(self.embed_tokens, cfg.tie_word_embeddings, dtype, device)

    # --- KV cache -------------------------------------------------------------------
    @property
    def num_kv_heads_local(self) -> int:
        return self.layers[0].self_attn.num_kv_heads

    def kv_bytes_per_slot(self, dtype: torch.dtype | None = None) -> int:
        """KV bytes one token takes on this rank, in the pool's dtype (the model's unless given)."""
        return self.config.kv_bytes_per_token(self.tp.size, (dtype or self.dtype).itemsize)

    def create_kv_pool(self, num_slots: int, page_size: int = 1, dtype: torch.dtype | None = None) -> KVPool:
        """A KV pool shaped for this model (and TP rank), attached to its attention backend."""
        pool = KVPool(
            self.config.num_layers, num_slots, self.num_kv_heads_local, self.config.head_dim,
            dtype or self.dtype, self.device, page_size,
        )
        self.attach_kv_pool(pool)
        return pool

    def attach_kv_pool(self, pool: KVPool) -> None:
        if pool.num_layers != self.config.num_layers:
            raise ValueError(f"KV pool has {pool.num_layers} layers, model has {self.config.num_layers}")
        self.attn_backend.attach_kv_pool(pool)

    # --- forward --------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.prepare(fb)
        return self.forward_prepared(fb)

    @torch.inference_mode()
    def forward_prepared(self, fb: ForwardBatch) -> torch.Tensor:
        """The layers alone, after the backend was prepared: what a CUDA graph captures."""
        x, rope = self.embed(fb.input_ids, fb.positions)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, fb, self.attn_backend)
        return self.head(x, residual, fb.last_token_index())

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """-> (token embeddings, rope (cos, sin) of the positions)."""
        return self.embed_tokens(input_ids), self.rotary(positions)

    def head(self, x: torch.Tensor, residual: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Logits of the rows ``last`` (each request's last new token): only those need the
        final norm."""
        x, _ = self.norm.add(x[last], residual[last])
        return self.lm_head(x)

    # --- weights --------------------------------------------------------------------
    def weight_map(self) -> dict[str, WeightTarget]:
        """HF checkpoint name -> (module, shard id, expected full shape)."""
        out: dict[str, WeightTarget] = {}

        def add(prefix: str, module: nn.Module, names: dict) -> None:
            shapes = module.hf_shapes()
            for hf_suffix, shard in names.items():
                if shard in shapes:
                    out[f"{prefix}.{hf_suffix}"] = (module, shard, shapes[shard])

        add("model.embed_tokens", self.embed_tokens, {"weight": "weight"})
        add("model.norm", self.norm, {"weight": "weight"})
        add("lm_head", self.lm_head, {"weight": "weight"})
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}"
            add(f"{p}.input_layernorm", layer.input_layernorm, {"weight": "weight"})
            add(f"{p}.post_attention_layernorm", layer.post_attention_layernorm, {"weight": "weight"})
            attn = layer.self_attn
            qkv = {f"{n}_proj.{k}": (n, k) for n in "qkv" for k in ("weight", "bias")}
            add(f"{p}.self_attn", attn.qkv_proj, qkv)
            add(f"{p}.self_attn.o_proj", attn.o_proj, {"weight": "weight", "bias": "bias"})
            if attn.q_norm is not None:
                add(f"{p}.self_attn.q_norm", attn.q_norm, {"weight": "weight"})
                add(f"{p}.self_attn.k_norm", attn.k_norm, {"weight": "weight"})
            gate_up = {f"{n}_proj.{k}": (j, k) for j, n in enumerate(("gate", "up")) for k in ("weight", "bias")}
            add(f"{p}.mlp", layer.mlp.gate_up_proj, gate_up)
            add(f"{p}.mlp.down_proj", layer.mlp.down_proj, {"weight": "weight", "bias": "bias"})
        return out

    def ignored_checkpoint_names(self) -> Iterator[str]:
        """Checkpoint tensors that are fine to skip silently."""
        if self.config.tie_word_embeddings:
            yield "lm_head.weight"
