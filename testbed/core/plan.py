"""What a policy asks for (BatchPlan) and what an executor reports back (StepResult)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from testbed.core.request import Request


@dataclass(slots=True)
class BatchPlan:
    """Requests to run this step and how many new tokens each computes.

    A decode is 1 token over a request's whole context; a prefill (or chunk of one) is n
    tokens after its cached prefix. Prefill and decode may mix in one plan. `preempt` lists
    running requests the policy wants preempted before the step (recompute later).
    After the scheduler has applied a plan, `cached_lens` holds each item's KV length
    before the step and `samples` whether the step produces a token for it (`num_samples`
    and `kv_tokens` their totals: every step's record and result check reads them), and
    `watch` the items whose result does more than deliver a token.
    """
    reqs: list[Request] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    preempt: list[Request] = field(default_factory=list)
    # filled by the scheduler when the plan is applied
    step_id: int = -1
    cached_lens: np.ndarray | None = None
    samples: np.ndarray | None = None  # bool per item
    num_samples: int = 0  # items that sample a token (samples.sum(), counted once)
    kv_tokens: int = 0  # KV tokens the step's attention reads: cached_lens.sum() + total_tokens
    # the items whose completion does more than take a token: a prefill chunk, a last token,
    # an EOS to check (indices, plan order); None: every item is looked at
    watch: list[int] | None = None

    def add(self, req: Request, n: int) -> None:
        self.reqs.append(req)
        self.num_tokens.append(n)

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    @property
    def extend_lens(self) -> np.ndarray:
        return np.asarray(self.num_tokens, dtype=np.int64)

    def num_decode(self) -> int:
        """Items that extend by exactly the one pending token (valid after the plan is applied)."""
        assert self.cached_lens is not None and self.samples is not None
        ext = self.extend_lens
        return int(np.count_nonzero((ext == 1) & self.samples & (self.cached_lens > 0)))


@dataclass(slots=True)
class StepResult:
    """What running a plan gave: its duration and one token per sampling item (plan order).

    `tokens` None means the executor produces no token ids (the scheduler then records
    placeholder ids, -1); `duration` is seconds the step took (simulated or measured)."""
    duration: float
    tokens: np.ndarray | None = None
    predicted: float | None = None  # cost-model prediction, on the real engine
