"""The request ledger: what a request is, where it stands, and when things happened to it.

Lengths follow one convention (after mini-SGLang's Req): `device_len` is how many tokens of
the sequence are known (prompt + generated so far, the newest one possibly still pending
on the device), `cached_len` is how many of them already have KV on the device. A step
extends a request by n tokens from `cached_len`; when that reaches `device_len`, the step
samples one new token and `device_len` grows by one.
"""
from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field

import numpy as np


class RequestState(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    ABORTED = 4
    REJECTED = 5


TERMINAL_STATES = (RequestState.FINISHED, RequestState.ABORTED, RequestState.REJECTED)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the engine picks a token; temperature 0 is greedy. The simulator ignores it."""
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"sampling top_k must be -1 (off) or >= 1, got {self.top_k}")


@dataclass(eq=False, slots=True)
class Request:
    rid: int
    prompt_len: int
    max_new_tokens: int
    arrival: float = 0.0
    prompt_ids: np.ndarray | None = None  # int32; None: length only, never shares KV
    ignore_eos: bool = True
    eos_token_ids: tuple[int, ...] = ()
    priority: int = 0  # larger = more important
    sampling: SamplingParams = field(default_factory=SamplingParams)

    # ledger
    state: RequestState = RequestState.WAITING
    cached_len: int = 0
    device_len: int = 0
    output_ids: list = field(default_factory=list)
    prefix_hit_tokens: int = 0  # tokens found in the prefix cache at first admission
    recomputed_tokens: int = 0  # tokens prefilled again after preemptions
    num_preemptions: int = 0
    finish_reason: str | None = None  # length / eos / abort / rejected
    reject_reason: str | None = None

    # event times (seconds from run start; simulated or wall clock)
    first_scheduled: float | None = None
    chunk_times: list = field(default_factory=list)  # (time, tokens) of each prefill chunk start
    first_token: float | None = None
    # one per output token, the first included; float64s in an array (8 bytes a token, not 32)
    token_times: array = field(default_factory=lambda: array("d"))
    preempt_times: list = field(default_factory=list)
    finish_time: float | None = None
    # on a server, after `arrival` (its frontend received it): a tokenizer had its ids, the scheduler queued it
    tokenized: float | None = None
    queued_at: float | None = None

    # scheduler bookkeeping (not for policies: they read what they need through SchedulerView)
    row: int = -1  # its page-table row while it holds KV
    num_pages: int = 0  # pages mapped for this request (shared prefix + own); view.pages_held
    shared_len: int = 0  # leading tokens on pages the prefix cache holds (shared, locked)
    cache_node: object = None  # locked prefix-cache node, or None
    inflight: int = 0  # steps in flight that touch this request
    admit_seq: int = -1  # order of (re)admission (view.admission_order); default preemption victim is the largest
    queued: bool = False  # in the scheduler's waiting queue
    plan_stamp: int = -1  # last step whose plan named it (duplicate check)
    # where the prompt ids come from when they are made at arrival (a trace's lazy ids,
    # testbed/traces/lazy_ids.py: ids(rid)); None once made, or when prompt_ids was given
    ids_source: object = None

    def __post_init__(self):
        if self.prompt_ids is not None:
            self._check_ids()
        if self.prompt_len < 1:
            raise ValueError(f"request {self.rid}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.rid}: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.device_len == 0:
            self.device_len = self.prompt_len

    def _check_ids(self) -> None:
        self.prompt_ids = np.ascontiguousarray(self.prompt_ids, dtype=np.int32)
        if self.prompt_len != len(self.prompt_ids):
            raise ValueError(
                f"request {self.rid}: prompt_len {self.prompt_len} != len(prompt_ids) {len(self.prompt_ids)}")

    def make_ids(self) -> None:
        """Take the prompt ids from ids_source (the request arrives: from now the scheduler
        may read them)."""
        if self.ids_source is not None:
            self.prompt_ids, self.ids_source = self.ids_source.ids(self.rid), None
            if self.prompt_ids is not None:
                self._check_ids()

    @property
    def max_len(self) -> int:
        return self.prompt_len + self.max_new_tokens

    @property
    def pending_tokens(self) -> int:
        """Sampled tokens scheduled but not yet delivered (the known tokens past the prompt
        that are not outputs yet): derived, so a step does not count them up and down."""
        return self.device_len - self.prompt_len - len(self.output_ids)

    @property
    def extend_len(self) -> int:
        """Tokens known but without KV: what the next prefill (or decode, = 1) must compute."""
        return self.device_len - self.cached_len

    @property
    def in_prefill(self) -> bool:
        return self.device_len - self.cached_len > 1

    @property
    def is_done(self) -> bool:
        return self.state in TERMINAL_STATES

    def token_slice(self, start: int, end: int) -> np.ndarray:
        """Tokens [start, end) of the known sequence, without building the whole of it (a
        decode step reads one token; token_ids(end)[start:] would copy the sequence)."""
        assert self.prompt_ids is not None
        P = self.prompt_len
        if end <= P:
            return self.prompt_ids[start:end]
        outs = np.asarray(self.output_ids[max(start - P, 0): end - P], dtype=np.int32)
        return outs if start >= P else np.concatenate([self.prompt_ids[start:], outs])

    def token_ids(self, n: int) -> np.ndarray:
        """The first n tokens of the known sequence (prompt then delivered outputs)."""
        assert self.prompt_ids is not None
        if n <= self.prompt_len:
            return self.prompt_ids[:n]
        return np.concatenate([self.prompt_ids, np.asarray(self.output_ids[: n - self.prompt_len], dtype=np.int32)])
