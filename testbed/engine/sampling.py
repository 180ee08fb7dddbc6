"""Token sampling in torch, batched over requests with different parameters.

Per row: temperature (0 = greedy: argmax of the raw logits), then top-k (k <= 0: off), then
top-p over the renormalised top-k distribution (p >= 1: off), then one draw by the
Gumbel-max trick: argmax(logits / T + g) with g = -log(-log u) ~ Gumbel(0, 1).

Randomness is counter based: u for (seed, step, token id) is a hash of the three, computed
with int64 tensor ops. A request's tokens therefore depend only on its own seed, its step
counter (tokens generated so far) and its logits -- not on the batch it shares, the order
of rows, or the device. Same seed, same tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["SamplingTensors", "Sampler", "sample", "uniform_noise"]

_M32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # float32 [B]; <= 0 means greedy
    top_k: torch.Tensor  # int64 [B]; <= 0 means off
    top_p: torch.Tensor  # float32 [B]; >= 1 means off
    seed: torch.Tensor  # int64 [B]
    step: torch.Tensor  # int64 [B] per-request counter (tokens generated so far)
    all_greedy: bool  # host-side flags, so sample() needs no device sync to skip work
    any_filter: bool

    @classmethod
    def build(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        seed: Sequence[int | None] | None = None,
        step: Sequence[int] | None = None,
        device: torch.device | str = "cpu",
        rng: random.Random | None = None,
    ) -> "SamplingTensors":
        """From per-request lists (host values). A None seed gets a fresh draw every call,
        from ``rng`` if given, else from torch's global (CPU) generator, so a run seeded with
        ``torch.manual_seed`` stays reproducible."""
        n = len(temperature)
        top_k = list(top_k) if top_k is not None else [0] * n
        top_p = list(top_p) if top_p is not None else [1.0] * n
        seed = list(seed) if seed is not None else [None] * n
        step = list(step) if step is not None else [0] * n
        if not len(top_k) == len(top_p) == len(seed) == len(step) == n:
            raise ValueError("sampling parameter lists must all have one entry per request")
        if any(s is None for s in seed):
            draw = (lambda: rng.getrandbits(62)) if rng is not None else (
                lambda: int(torch.randint(0, 2**62, (1,)).item()))
            seed = [draw() if s is None else s for s in seed]
        temps = [float(t) for t in temperature]
        greedy = [t <= 0 for t in temps]
        all_greedy = all(greedy)
        any_filter = any(
            not g and (k > 0 or p < 1.0) for g, k, p in zip(greedy, top_k, top_p)
        )
        # built on the host, then copied without blocking: torch.tensor(..., device="cuda")
        # would wait for the device to drain, and the engine overlaps this with a running step
        def put(values, dtype):
            if all_greedy:  # sample() reads none of them: no copies
                return torch.empty(0, dtype=dtype)
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        return cls(
            temperature=put(temps, torch.float32),
            top_k=put(top_k, torch.int64),
            top_p=put(top_p, torch.float32),
            seed=put([int(s) & (2**63 - 1) for s in seed], torch.int64),
            step=put(step, torch.int64),
            all_greedy=all_greedy,
            any_filter=any_filter,
        )


class Sampler:
    """Holds the rng that seeds requests without a seed; ``sampler(logits, ...)`` samples."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def tensors(self, temperature, top_k=None, top_p=None, seed=None, step=None, device="cpu"):
        return SamplingTensors.build(temperature, top_k, top_p, seed, step, device, self.rng)

    def __call__(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        return sample(logits, params)


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """logits [B, V] -> token ids int64 [B]."""
    greedy_ids = logits.argmax(dim=-1)
    if params.all_greedy:
        return greedy_ids
    temp = params.temperature.to(logits.device)
    scaled = logits.float() / temp.clamp_min(1e-6)[:, None]
    gumbel = -torch.log(-torch.log(uniform_noise(params.seed, params.step, logits.shape[-1])))
    gumbel = gumbel.to(logits.device)
    if params.any_filter:
        sampled = _sample_filtered(scaled, gumbel, params.top_k.to(logits.device), params.top_p.to(logits.device))
    else:
        sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(temp <= 0, greedy_ids, sampled)


def _sample_filtered(scaled, gumbel, top_k, top_p) -> torch.Tensor:
    V = scaled.shape[-1]
    vals, idx = scaled.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(V, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k.clamp_max(V), torch.full_like(top_k, V))
    vals = vals.masked_fill(rank >= k[:, None], float("-inf"))
    probs = torch.softmax(vals, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    outside = (mass_before >= top_p[:, None]) & (rank > 0)  # the top token always stays
    vals = vals.masked_fill(outside, float("-inf"))
    pos = (vals + gumbel.gather(-1, idx)).argmax(dim=-1, keepdim=True)
    return idx.gather(-1, pos).squeeze(-1)


# --- counter-based uniforms ---------------------------------------------------------------


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) without overflowing int64."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + ((hi * (c & 0xFFFF)) << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser (a bijection with good avalanche)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [B, vocab] in (0, 1), a pure function of (seed[b], step[b], token id)."""
    seed, step = seed.long(), step.long()
    row = _fmix32(seed & _M32)
    row = _fmix32(row ^ ((seed >> 32) & _M32))
    row = _fmix32(row ^ _mul32(step & _M32, 0x9E3779B9))
    tok = torch.arange(vocab, dtype=torch.int64, device=seed.device)
    h = _fmix32(row[:, None] ^ _mul32(tok, 0x27D4EB2F)[None, :])
    h = _fmix32(h ^ row[:, None])
    # 23 bits + 0.5 is exact in float32, so u stays strictly inside (0, 1).
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))
