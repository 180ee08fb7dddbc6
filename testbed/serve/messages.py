"""What the serving processes send each other (pickled over ZeroMQ). Every message about a
request carries its id (`rid`), given by the app and kept through every stage. Stage times
are time.perf_counter() values: CLOCK_MONOTONIC on Linux, one clock for every process of the
machine, so the scheduler puts them on its run's clock by subtracting its own origin."""
from __future__ import annotations

from dataclasses import dataclass, field

from testbed.core import SamplingParams


@dataclass
class GenerateReq:
    """app -> tokenizer: one request as the client gave it."""
    rid: int
    text: str | None = None  # a completion prompt
    input_ids: list[int] | None = None  # or the prompt's token ids
    messages: list[dict] | None = None  # or a chat, rendered with the model's chat template
    max_tokens: int | None = None  # None: `default_max_tokens`, or the rest of the context when that is None
    default_max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    received: float | None = None  # when the app's handler got the request


@dataclass
class TokenizedReq:
    """tokenizer -> scheduler: a request ready to queue."""
    rid: int
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    ignore_eos: bool
    received: float | None = None  # GenerateReq's
    tokenized: float | None = None  # when the tokenizer had its ids and limits


@dataclass
class DetokenizeReq:
    """tokenizer -> detokenizer: how to turn the request's tokens into text."""
    rid: int
    prompt_tokens: int
    stop: tuple[str, ...]


@dataclass
class Abort:
    """app (client gone) or detokenizer (a stop string: reason "stop") -> scheduler."""
    rid: int
    reason: str = "abort"


@dataclass
class Shutdown:
    """launcher -> scheduler: end every request, finish the run and write its files."""


@dataclass
class KVCheck:
    """The KV integrity check the scheduler ran when it went idle (serve.idle_kv_check)."""
    number: int  # checks run so far, this one included
    ok: bool  # every page in one place, and none held by a request (none is live)
    in_use: int | None  # pages held by requests (0 unless leaked); None when the check itself failed
    error: str | None = None


@dataclass
class SchedulerStats:
    """The scheduler's state after its latest event, for /metrics."""
    running: int
    waiting: int
    pages_used: int
    pages_cached: int
    pages_free: int
    num_pages: int
    kv_check: KVCheck | None = None  # the check run just now, if one was


@dataclass
class TokenOut:
    rid: int
    new_ids: list[int]
    finish_reason: str | None = None  # length / eos / abort / stop / rejected, once it ended
    reject_reason: str | None = None


@dataclass
class TokenBatch:
    """scheduler -> detokenizer: what one event (a step, arrivals, aborts) gave."""
    outs: list[TokenOut]
    stats: SchedulerStats


@dataclass
class TextOut:
    """detokenizer -> app: new text of a request, or its end."""
    rid: int
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # OpenAI's: length / stop; or abort
    error: str | None = None  # the request could not run (rejected by the scheduler)


@dataclass
class TextBatch:
    outs: list[TextOut]
    stats: SchedulerStats | None


@dataclass
class ErrorOut:
    """tokenizer -> app: a request that cannot be served (HTTP `status`, OpenAI-style error)."""
    rid: int
    status: int
    message: str
    param: str | None = None
