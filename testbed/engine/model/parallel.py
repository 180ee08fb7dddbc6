"""Tensor-parallel building blocks (Megatron-style); all of them are plain layers at tp=1.

- column parallel (qkv, gate/up): each rank holds a slice of the output features, no comm;
- row parallel (o, down): each rank holds a slice of the input features, partial sums are
  all-reduced;
- vocab parallel (embedding, lm head): each rank holds a slice of the (padded) vocabulary;
  the embedding all-reduces, the lm head all-gathers the logits.

Each layer knows how to take its shard out of a full HF tensor: ``load(shard_id, reader)``
where ``reader.shape`` is the full checkpoint shape and ``reader.read(dim, start, end)``
returns the slice along one dim (a safetensors ``get_slice`` or a generated tensor), so a
rank never reads more of the checkpoint than it keeps. ``hf_shapes()`` gives the full shape
each shard id expects, for the loader's shape check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "TensorParallel",
    "TensorReader",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "QKVParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "ParallelLMHead",
]


class TensorReader(Protocol):
    shape: tuple[int, ...]

    def read(self, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The whole tensor (dim None) or its [start:end] slice along ``dim``."""


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in the tensor-parallel group (group None: the default world group)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"bad tensor-parallel rank {self.rank} of size {self.size}")

    def divide(self, n: int, what: str) -> int:
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by tp_size {self.size}")
        return n // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)  # list form: works on gloo and nccl
        return torch.cat(parts, dim=dim)


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def _copy_rows(param: torch.Tensor, dst_start: int, src: torch.Tensor) -> None:
    param.data.narrow(0, dst_start, src.shape[0]).copy_(src)


class _Linear(nn.Module):
    def __init__(self, out_local: int, in_local: int, bias: bool, dtype, device) -> None:
        super().__init__()
        self.weight = _param((out_local, in_local), dtype, device)
        self.bias = _param((out_local,), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full checkpoint shapes (subclasses set in_features / out_features, the unsharded sizes)."""
        shapes = {"weight": (self.out_features, self.in_features)}
        if self.bias is not None:
            shapes["bias"] = (self.out_features,)
        return shapes

    def _load_rows(self, reader: TensorReader, is_bias: bool, src_start: int, n: int, dst_start: int):
        target = self.bias if is_bias else self.weight
        _copy_rows(target, dst_start, reader.read(0, src_start, src_start + n))


class ColumnParallelLinear(_Linear):
    """y = x W^T + b with W's rows (output features) split over ranks; output stays sharded."""

    def __init__(self, in_features, out_features, bias, tp: TensorParallel, dtype, device) -> None:
        self.tp, self.in_features, self.out_features = tp, in_features, out_features
        self.out_local = tp.divide(out_features, "output features")
        super().__init__(self.out_local, in_features, bias, dtype, device)

    def load(self, shard_id: str, reader: TensorReader) -> None:
        self._load_rows(reader, shard_id == "bias", self.tp.rank * self.out_local, self.out_local, 0)


class MergedColumnParallelLinear(_Linear):
    """Several column-parallel outputs in one matmul (gate and up): each rank holds its slice
    of every part, concatenated. Shard ids are ``(part_index, "weight" | "bias")``."""

    def __init__(self, in_features, out_parts: list[int], bias, tp: TensorParallel, dtype, device):
        self.tp, self.in_features, self.out_parts = tp, in_features, list(out_parts)
        self.local_parts = [tp.divide(n, "output features") for n in out_parts]
        super().__init__(sum(self.local_parts), in_features, bias, dtype, device)

    def hf_shapes(self) -> dict[tuple[int, str], tuple[int, ...]]:
        shapes = {}
        for i, n in enumerate(self.out_parts):
            shapes[(i, "weight")] = (n, self.in_features)
            if self.bias is not None:
                shapes[(i, "bias")] = (n,)
        return shapes

    def load(self, shard_id: tuple[int, str], reader: TensorReader) -> None:
        part, kind = shard_id
        n = self.local_parts[part]
        dst = sum(self.local_parts[:part])
        self._load_rows(reader, kind == "bias", self.tp.rank * n, n, dst)


class QKVParallelLinear(_Linear):
    """Fused q/k/v projection split by heads. With fewer kv heads than ranks each kv head is
    replicated on tp_size / num_kv_heads ranks. Shard ids ``("q"|"k"|"v", "weight"|"bias")``."""

    def __init__(self, hidden, head_dim, num_heads, num_kv_heads, bias, tp: TensorParallel, dtype, device):
        self.tp, self.hidden, self.head_dim = tp, hidden, head_dim
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.heads_local = tp.divide(num_heads, "num_attention_heads")
        if num_kv_heads >= tp.size:
            self.kv_heads_local = tp.divide(num_kv_heads, "num_key_value_heads")
            self.kv_head_start = tp.rank * self.kv_heads_local
        else:
            if tp.size % num_kv_heads:
                raise ValueError(
                    f"tp_size {tp.size} must be a multiple of num_key_value_heads {num_kv_heads}"
                )
            self.kv_heads_local = 1
            self.kv_head_start = tp.rank // (tp.size // num_kv_heads)
        q, kv = self.heads_local * head_dim, self.kv_heads_local * head_dim
        self.local_sizes = {"q": q, "k": kv, "v": kv}
        super().__init__(q + 2 * kv, hidden, bias, dtype, device)

    def hf_shapes(self) -> dict[tuple[str, str], tuple[int, ...]]:
        full = {"q": self.num_heads, "k": self.num_kv_heads, "v": self.num_kv_heads}
        shapes = {}
        for part, heads in full.items():
            shapes[(part, "weight")] = (heads * self.head_dim, self.hidden)
            if self.bias is not None:
                shapes[(part, "bias")] = (heads * self.head_dim,)
        return shapes

    def load(self, shard_id: tuple[str, str], reader: TensorReader) -> None:
        part, kind = shard_id
        first_head = self.tp.rank * self.heads_local if part == "q" else self.kv_head_start
        dst = {"q": 0, "k": self.local_sizes["q"], "v": self.local_sizes["q"] + self.local_sizes["k"]}[part]
        self._load_rows(reader, kind == "bias", first_head * self.head_dim, self.local_sizes[part], dst)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.local_sizes
        return qkv.split([s["q"], s["k"], s["v"]], dim=-1)


class RowParallelLinear(_Linear):
    """y = all_reduce(x_local W_local^T) + b with W's columns (input features) split over
    ranks; the input comes sharded (from a column-parallel layer), the output is whole."""

    def __init__(self, in_features, out_features, bias, tp: TensorParallel, dtype, device) -> None:
        self.tp, self.in_features, self.out_features = tp, in_features, out_features
        self.in_local = tp.divide(in_features, "input features")
        super().__init__(out_features, self.in_local, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def load(self, shard_id: str, reader: TensorReader) -> None:
        if shard_id == "bias":
            self.bias.data.copy_(reader.read())
            return
        start = self.tp.rank * self.in_local
        self.weight.data.copy_(reader.read(1, start, start + self.in_local))


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over ranks by vocabulary range (vocab padded to a multiple of
    ``pad_to * tp_size``); out-of-range ids give zeros locally and the all-reduce sums the
    one rank that has them."""

    def __init__(self, vocab_size, hidden, tp: TensorParallel, dtype, device, pad_to: int = 64):
        super().__init__()
        self.tp, self.vocab_size, self.hidden = tp, vocab_size, hidden
        multiple = pad_to * tp.size if tp.size > 1 else 1
        self.padded_vocab = -(-vocab_size // multiple) * multiple
        self.vocab_local = self.padded_vocab // tp.size
        self.vocab_start = tp.rank * self.vocab_local
        self.weight = _param((self.vocab_local, hidden), dtype, device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.vocab_local)
        out = F.embedding(torch.where(inside, local, torch.zeros_like(local)), self.weight)
        out = out * inside.unsqueeze(-1).to(out.dtype)
        return self.tp.all_reduce(out)

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.vocab_size, self.hidden)}

    def load(self, shard_id: str, reader: TensorReader) -> None:
        _load_vocab_rows(self.weight, reader, self.vocab_start, self.vocab_local, self.vocab_size)


class ParallelLMHead(nn.Module):
    """Logits over the vocabulary, rows split like the :class:`VocabParallelEmbedding` it is
    given; the shards are all-gathered and the padding trimmed. ``tied``: reuse its weight."""

    def __init__(self, embedding: VocabParallelEmbedding, tied: bool, dtype, device) -> None:
        super().__init__()
        self.tp = embedding.tp
        self.vocab_size, self.hidden = embedding.vocab_size, embedding.hidden
        self.vocab_start, self.vocab_local = embedding.vocab_start, embedding.vocab_local
        self.tied = tied
        if tied:
            self.weight = embedding.weight
        else:
            self.weight = _param(tuple(embedding.weight.shape), dtype, device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.tp.all_gather(F.linear(h, self.weight), dim=-1)
        return logits[..., : self.vocab_size]

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        return {} if self.tied else {"weight": (self.vocab_size, self.hidden)}

    def load(self, shard_id: str, reader: TensorReader) -> None:
        _load_vocab_rows(self.weight, reader, self.vocab_start, self.vocab_local, self.vocab_size)


def _load_vocab_rows(weight, reader: TensorReader, start: int, local: int, vocab: int) -> None:
    end = min(start + local, vocab)
    n = max(0, end - start)
    if n < local:
        weight.data[n:].zero_()  # padding rows past the real vocabulary
    if n:
        _copy_rows(weight, 0, reader.read(0, start, end))
