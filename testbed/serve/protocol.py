"""The HTTP APIs' request bodies (OpenAI /v1/completions and /v1/chat/completions,
SGLang-style /generate), checked and turned into a GenerateReq; what is wrong with one is an
ApiError: the HTTP status and an OpenAI-style error body."""
from __future__ import annotations

import json
import random
from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from testbed.core import SamplingParams
from testbed.serve.messages import GenerateReq

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GENERATE_MAX_TOKENS = 128  # SGLang's default max_new_tokens for /generate
# /v1/chat/completions without max_tokens: the rest of the context


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _is_token_ids(v) -> bool:
    """A list of JSON integers, as it came: pydantic alone would take true as 1 and 2.0 as 2."""
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _token_ids(v):
    if not _is_token_ids(v):
        raise ValueError("must be a list of token ids (integers)")
    return v


def _text_or_token_ids(v):
    if not (isinstance(v, str) or _is_token_ids(v)):
        raise ValueError("must be a string or a list of token ids (integers)")
    return v


def _stop(v):
    if v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        return v
    raise ValueError("must be a string or a list of strings")


def _content(v):
    """A message's content: text, or a list of text parts (the only kind a text model serves)."""
    if v is None or isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise ValueError("must be a string or a list of text parts")
    for i, part in enumerate(v):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"part {i} is {'of type ' + repr(kind) if kind else 'not a text part'}: "
                             "only text parts ({\"type\": \"text\", \"text\": ...}) are served")
    return v


TokenIds = Annotated[list[int], BeforeValidator(_token_ids)]
TextOrTokenIds = Annotated[Union[str, list[int]], BeforeValidator(_text_or_token_ids)]
Stop = Annotated[Union[str, list[str], None], BeforeValidator(_stop)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # fields other servers take (user, logit_bias...) are ignored


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    """What every API names alike (testbed.core.SamplingParams, stop strings, ignore_eos)."""
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = -1
    seed: int | None = None
    stop: Stop = None
    ignore_eos: bool = False


class _Sampling(_SamplingFields):
    model: str | None = None  # None: the one model served
    max_tokens: int | None = Field(None, ge=1)
    n: Literal[1] = 1  # one choice per request
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionBody(_Sampling):
    prompt: TextOrTokenIds  # text, or its token ids


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: Annotated[Union[str, list[ContentPart], None], BeforeValidator(_content)] = None

    def as_template_input(self) -> dict:
        c = self.content
        return {"role": self.role, "content": c if isinstance(c, str) or c is None else "".join(p.text for p in c)}


class ChatBody(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens


class GenerateSampling(_SamplingFields):
    max_new_tokens: int | None = Field(None, ge=1)


class GenerateBody(_Body):
    text: str | None = None
    input_ids: TokenIds | None = None
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    stream: bool = False


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def validate(model_cls, body: dict):
    try:
        return model_cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]  # ours, without "Value error, "
        raise ApiError(400, f"{where}: {msg}" if where else msg,
                       str(err["loc"][0]) if err["loc"] else None) from None


def sampling(temperature, top_p, top_k, seed) -> SamplingParams:
    try:  # its own checks (top_k -1 or >= 1) say what is wrong
        return SamplingParams(temperature, top_k, top_p, random.getrandbits(62) if seed is None else seed)
    except ValueError as e:
        raise ApiError(400, str(e), next((p for p in ("temperature", "top_p", "top_k") if p in str(e)), None)) from None


def _sampling_args(b: _SamplingFields) -> dict:
    """The GenerateReq arguments every API's sampling fields give."""
    return {"sampling": sampling(b.temperature, b.top_p, b.top_k, b.seed),
            "stop": (b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ()), "ignore_eos": b.ignore_eos}


def completion_req(rid: int, b: CompletionBody) -> GenerateReq:
    text, ids = (b.prompt, None) if isinstance(b.prompt, str) else (None, b.prompt)
    return GenerateReq(rid, text=text, input_ids=ids, max_tokens=b.max_tokens,
                       default_max_tokens=COMPLETION_MAX_TOKENS, **_sampling_args(b))


def chat_req(rid: int, b: ChatBody) -> GenerateReq:
    return GenerateReq(rid, messages=[m.as_template_input() for m in b.messages],
                       max_tokens=b.max_completion_tokens or b.max_tokens, **_sampling_args(b))


def generate_req(rid: int, b: GenerateBody) -> GenerateReq:
    if (b.text is None) == (b.input_ids is None):
        raise ApiError(400, "give exactly one of text and input_ids", "text")
    s = b.sampling_params
    return GenerateReq(rid, text=b.text, input_ids=b.input_ids, max_tokens=s.max_new_tokens,
                       default_max_tokens=GENERATE_MAX_TOKENS, **_sampling_args(s))
