"""Reference attention in plain torch: a loop over requests, runs anywhere (CPU tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from testbed.engine.attention import ATTENTION_BACKENDS
from testbed.engine.attention.base import AttentionBackend
from testbed.engine.forward_batch import ForwardBatch

__all__ = ["TorchAttentionBackend"]


@ATTENTION_BACKENDS.register("torch")
class TorchAttentionBackend(AttentionBackend):
    """Gathers each request's context K/V by its slots and runs SDPA with a causal mask
    shifted by the cached prefix (new token j of n attends to positions <= ctx - n + j).
    GQA by repeating kv heads. Slow (host loop over requests) but obviously correct."""

    name = "torch"

    def prepare(self, fb: ForwardBatch) -> None:
        qo = fb.host_qo_indptr().tolist()
        kv = fb.host_kv_indptr().tolist()
        device = fb.kv_indices.device
        self._segments = []
        for i in range(fb.batch_size):
            n, ctx = qo[i + 1] - qo[i], kv[i + 1] - kv[i]
            slots = fb.kv_indices[kv[i] : kv[i + 1]].long()
            if n == 1:
                mask = None  # the newest token sees the whole context
            else:
                q_pos = torch.arange(ctx - n, ctx, device=device)
                mask = torch.arange(ctx, device=device)[None, :] <= q_pos[:, None]
            self._segments.append((qo[i], qo[i + 1], slots, mask))

    def attend(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        pool = self.pool
        k_buf, v_buf = pool.k[layer_id], pool.v[layer_id]
        group = self.num_qo_heads // self.num_kv_heads
        out = torch.empty_like(q) if out is None else out
        for q_start, q_end, slots, mask in self._segments:
            kk = k_buf[slots].to(q.dtype)  # [ctx, kv_heads, D]
            vv = v_buf[slots].to(q.dtype)
            if group > 1:
                kk = kk.repeat_interleave(group, dim=1)
                vv = vv.repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(
                q[q_start:q_end].transpose(0, 1),  # [H, n, D]
                kk.transpose(0, 1),  # [H, ctx, D]
                vv.transpose(0, 1),
                attn_mask=mask,
                scale=self.sm_scale,
            )
            out[q_start:q_end] = o.transpose(0, 1)
        return out
