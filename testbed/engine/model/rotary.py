"""Rotary position embedding (rotate-half layout, as HF Llama/Qwen) with optional scaling."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

__all__ = ["rope_inv_freq", "RotaryEmbedding"]


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), i < d/2, float32, with the config's scaling applied."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scaling(inv_freq, scaling)
    raise NotImplementedError(
        f"rope scaling {rope_type!r} is not supported (supported: default, linear, llama3)"
    )


def _llama3_scaling(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies (wavelength < L / high_freq_factor), divide low ones
    (wavelength > L / low_freq_factor) by ``factor``, and blend linearly in between in
    L / wavelength, where L is the original context length."""
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_len = float(s.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)


class RotaryEmbedding(nn.Module):
    """positions -> (cos, sin), float32 [T, head_dim / 2]; computed once per step, used by every layer."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, device) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return freqs.cos(), freqs.sin()

