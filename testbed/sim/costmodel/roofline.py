"""Analytic roofline cost model: FLOPs and bytes of a step against the hardware's ceilings.

Per step and per tensor-parallel rank, for a batch of B requests where request i extends
by n_i tokens over c_i cached ones (T = sum n_i tokens):

* ``linear``: q, k, v, o, gate, up, down of every layer. FLOPs = 2 * P_lin * T; bytes = the
  weights once + the activations each matmul reads and writes, the SwiGLU product and the
  two RMSNorms (per token and layer), and the embedding rows gathered.
* ``attention``: causal attention of each request's n new queries over its c + j keys
  (the j-th new token sees c + j + 1 keys): FLOPs = 4 * head_dim * q_heads * sum_i
  (n_i c_i + n_i (n_i + 1) / 2) per layer (q.k and p.v); bytes = read the K and V of
  c_i + n_i tokens, write the K and V of n_i, read q and write o of n_i.
* ``lm_head``: the output projection for one row per request (the token it samples; a
  prefill chunk that ends mid-prompt is counted too, a simplification), reading its
  weights once.
* ``allreduce`` (tp > 1): two all-reduces of T * hidden * dtype bytes per layer (after
  attention's o and the MLP's down projection), ring cost
  2 (tp-1)/tp * bytes / (link_bw * eff_link) + link_latency_s each.
* ``logits_gather`` (tp > 1): the vocab-parallel logits all-gathered for sampling,
  (tp-1)/tp * B * vocab * dtype / (link_bw * eff_link) + link_latency_s.
* ``step_overhead``: fixed per step; ``request_overhead``: per request in the batch.

Each compute term costs max(FLOPs / (flops * eff_compute), bytes / (mem_bw * eff_mem));
the terms are summed (the kernels run one after another).

Tensor parallelism (Megatron-style): q heads, the intermediate size and the vocabulary
are split by tp; kv heads are split when there are at least tp of them and replicated
(one per rank) otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from testbed.modelspec import ModelSpec, tp_split_problems
from testbed.sim.costmodel.base import COST_MODELS, StepCost, as_batch
from testbed.sim.costmodel.hardware import HardwareSpec

__all__ = ["RooflineConfig", "RooflineCostModel", "TERMS"]

#: Names of the terms of ``breakdown``, in order; they sum to ``step_time``.
TERMS = (
    "linear",
    "attention",
    "lm_head",
    "allreduce",
    "logits_gather",
    "step_overhead",
    "request_overhead",
)


@dataclass
class RooflineConfig:
    """Parameters of the roofline model (conf/costmodel/roofline.yaml mirrors them).

    eff_compute: fraction of ``hardware.flops`` reached by compute-bound kernels. The h200
        figure is a measured large-matmul ceiling; whole-model prefill GEMMs of 8B-class
        shapes plus flash attention reach roughly 75-85% of such a ceiling -> 0.8.
    eff_mem: fraction of ``hardware.mem_bw`` reached by memory-bound kernels (decode GEMV /
        small-batch GEMMs streaming weights, decode attention streaming KV). The h200 figure
        is a measured copy bandwidth, which good weight-streaming kernels get close to but do
        not match -> 0.85.
    eff_link: fraction of ``hardware.link_bw`` an all-reduce reaches (NCCL ring bus
        bandwidth over NVLink is typically 70-85% of the per-direction link rate) -> 0.8.
    step_overhead_s: fixed cost per step not covered by the roofline: kernel-launch gaps
        inside a CUDA graph (a few hundred kernels per step at ~1 us), sampling, and the
        CPU scheduling that overlap scheduling does not hide -> 0.5 ms. The first thing the
        calibrated model should replace.
    per_request_overhead_s: CPU work per request per step (building page-table rows,
        sampling params). With overlap scheduling it hides behind the GPU step, so 0.
    tp: tensor-parallel degree (the step time of one rank; all ranks run in lockstep).
    """

    eff_compute: float = 0.8
    eff_mem: float = 0.85
    eff_link: float = 0.8
    step_overhead_s: float = 5e-4
    per_request_overhead_s: float = 0.0
    tp: int = 1

    def __post_init__(self) -> None:
        for key in ("eff_compute", "eff_mem", "eff_link"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 1):
                raise ValueError(
                    f"costmodel.{key}={v!r} is invalid; allowed: a number in (0, 1]"
                )
            setattr(self, key, float(v))
        for key in ("step_overhead_s", "per_request_overhead_s"):
            v = getattr(self, key)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or v < 0
            ):
                raise ValueError(
                    f"costmodel.{key}={v!r} is invalid; allowed: a number >= 0 (seconds)"
                )
            setattr(self, key, float(v))
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"engine.tp={self.tp!r} is invalid; allowed: an integer >= 1")


def allowed_tp(spec: ModelSpec, limit: int = 64) -> list[int]:
    """TP degrees up to ``limit`` that split the model's heads and MLP evenly."""
    return [t for t in range(1, limit + 1) if not tp_split_problems(spec, t)]


class RooflineCostModel:
    """Roofline step time of one TP rank; see the module docstring for the terms."""

    wake = None  # no host, so no host that wakes

    def __init__(self, spec: ModelSpec, hardware: HardwareSpec, cfg: RooflineConfig | None = None):
        cfg = cfg if cfg is not None else RooflineConfig()
        tp = cfg.tp
        if tp not in allowed_tp(spec, limit=max(64, tp)):
            raise ValueError(
                f"engine.tp={tp} is invalid for {spec.name or spec.architecture} "
                f"(q_heads={spec.num_q_heads}, kv_heads={spec.num_kv_heads}, "
                f"intermediate={spec.intermediate_size}); allowed: {allowed_tp(spec)}"
            )
        self.spec, self.hardware, self.cfg = spec, hardware, cfg

        h, hd, L, dt = spec.hidden_size, spec.head_dim, spec.num_layers, spec.dtype_bytes
        qh = spec.num_q_heads // tp
        kvh = spec.kv_heads_per_rank(tp)
        inter = spec.intermediate_size // tp
        vocab = -(-spec.vocab_size // tp)  # vocab-parallel shard (padded)
        self.heads_per_rank = (qh, kvh)

        # Linear layers of one layer on this rank.
        p_attn = h * qh * hd + 2 * h * kvh * hd + qh * hd * h
        if spec.attention_bias:
            p_attn += (qh + 2 * kvh) * hd
        if spec.o_bias:
            p_attn += h
        p_mlp = 3 * h * inter
        if spec.mlp_bias:
            p_mlp += 2 * inter + h
        p_lin = L * (p_attn + p_mlp)
        # Activation elements per token and layer: matmul inputs + outputs (fused qkv,
        # o, fused gate_up, down), the SwiGLU product (read 2*inter, write inter), and two
        # fused add+RMSNorms (read x and residual, write both: 4h each).
        act = (h + (qh + 2 * kvh) * hd) + (qh * hd + h) + (h + 2 * inter) + (inter + h)
        act += 3 * inter + 2 * 4 * h

        c_flop = 1.0 / (hardware.flops * cfg.eff_compute)
        c_byte = 1.0 / (hardware.mem_bw * cfg.eff_mem)
        self._c_flop, self._c_byte = c_flop, c_byte

        self.linear_weight_bytes = p_lin * dt
        self.lm_head_weight_bytes = vocab * h * dt
        # Seconds per unit, so a call is a handful of multiply-adds.
        self._lin_flop_tok = 2.0 * p_lin * c_flop
        self._lin_byte_fix = (p_lin * dt + h * dt) * c_byte  # weights + final norm weight
        self._lin_byte_tok = (L * act + h) * dt * c_byte  # + embedding row gathered
        self._att_flop_pair = 4.0 * hd * qh * L * c_flop
        self._att_byte_kv = spec.kv_bytes_per_token(tp) * c_byte  # K+V of a token, read
        self._att_byte_new = (2.0 * kvh * hd + 2.0 * qh * hd) * dt * L * c_byte  # write kv, q, o
        self._lm_flop_row = 2.0 * vocab * h * c_flop
        self._lm_byte_fix = vocab * h * dt * c_byte
        self._lm_byte_row = (h + vocab) * dt * c_byte  # read hidden row, write logits
        if tp > 1:
            link = hardware.link_bw * cfg.eff_link
            self._ar_fix = 2 * L * hardware.link_latency_s
            self._ar_tok = 2 * L * 2.0 * (tp - 1) / tp * h * dt / link
            self._lg_fix = hardware.link_latency_s
            self._lg_row = (tp - 1) / tp * (vocab * tp) * dt / link
        else:
            self._ar_fix = self._ar_tok = self._lg_fix = self._lg_row = 0.0
        self._step = cfg.step_overhead_s
        self._per_req = cfg.per_request_overhead_s

    # ------------------------------------------------------------------ public API
    def _terms(self, extend_lens, cached_lens) -> tuple[float, ...]:
        n, c = as_batch(extend_lens, cached_lens)
        b = n.shape[0]
        tokens = float(n.sum())
        # sum_i n_i c_i + n_i (n_i + 1) / 2: (query, key) pairs under the causal mask.
        pairs = float(n @ c) + 0.5 * float(n @ (n + 1))
        kv_read = float(c.sum()) + tokens
        linear = max(self._lin_flop_tok * tokens, self._lin_byte_fix + self._lin_byte_tok * tokens)
        attention = max(
            self._att_flop_pair * pairs, self._att_byte_kv * kv_read + self._att_byte_new * tokens
        )
        lm_head = max(self._lm_flop_row * b, self._lm_byte_fix + self._lm_byte_row * b)
        allreduce = self._ar_fix + self._ar_tok * tokens  # both 0 at tp == 1
        gather = self._lg_fix + self._lg_row * b
        return (linear, attention, lm_head, allreduce, gather, self._step, self._per_req * b)

    def decode_costs(self, cached: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
        """step_cost of k decode steps over contexts cached + j (j < k), as arrays: _terms' sums
        in closed form over the steps, the same float operations in the same order."""
        b = len(cached)
        tokens = float(b)
        ctx = (int(cached.sum()) + b * np.arange(k, dtype=np.int64)).astype(float)  # n @ c of each step
        pairs = ctx + 0.5 * float(2 * b)  # n @ (n + 1) of a decode is 2b
        kv_read = ctx + tokens
        linear = max(self._lin_flop_tok * tokens, self._lin_byte_fix + self._lin_byte_tok * tokens)
        attention = np.maximum(self._att_flop_pair * pairs, self._att_byte_kv * kv_read + self._att_byte_new * tokens)
        lm_head = max(self._lm_flop_row * b, self._lm_byte_fix + self._lm_byte_row * b)
        allreduce = self._ar_fix + self._ar_tok * tokens
        gather = self._lg_fix + self._lg_row * b
        device = 0 + linear + attention + lm_head + allreduce + gather + self._step + self._per_req * b  # sum()'s order
        zero = np.zeros(k)
        return zero, zero, device, zero

    def step_time(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> float:
        """Seconds for one step; raises ValueError on an empty or malformed batch."""
        return sum(self._terms(extend_lens, cached_lens))

    def step_cost(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> StepCost:
        """The roofline knows no host: every term is device time (its step and request overheads
        stand for the engine's fixed costs)."""
        return StepCost(0.0, 0.0, self.step_time(extend_lens, cached_lens), 0.0)

    def breakdown(self, extend_lens: np.ndarray, cached_lens: np.ndarray) -> dict[str, float]:
        """Seconds per term (``TERMS``); the values sum to ``step_time``."""
        return dict(zip(TERMS, self._terms(extend_lens, cached_lens)))

    def __repr__(self) -> str:
        return (
            f"RooflineCostModel(model={self.spec.name or self.spec.architecture}, "
            f"hardware={self.hardware.name}, cfg={self.cfg})"
        )


@COST_MODELS.register("roofline", config=RooflineConfig)
def _make_roofline(spec: ModelSpec, hardware: HardwareSpec, cfg: RooflineConfig) -> RooflineCostModel:
    return RooflineCostModel(spec, hardware, cfg)
