"""What the scheduler did in one step: the scheduler's part of a steps.parquet row."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepStats:
    """What happened in the scheduler for one step (a row of steps.parquet, with the driver's times)."""
    step_id: int
    prefill_reqs: int = 0
    prefill_tokens: int = 0
    decode_reqs: int = 0
    decode_tokens: int = 0
    evicted_pages: int = 0
    preempted: int = 0
    admitted: int = 0
    deferred: int = 0  # plan items dropped for lack of KV or rows
