"""The HTTP frontend (FastAPI): /health, /v1/models, /generate, /v1/completions,
/v1/chat/completions, /metrics. A request gets its id here and goes to a tokenizer worker;
its text comes back from the detokenizer into the request's queue. A client that goes away
before its request has ended aborts it (the scheduler frees its KV)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from contextlib import asynccontextmanager
from itertools import count

import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from testbed.serve import protocol as P
from testbed.serve.channels import Channels, pull, push
from testbed.serve.messages import Abort, ErrorOut, GenerateReq, TextBatch, TextOut
from testbed.serve.metrics import ServerMetrics


class ClientGone(Exception):
    pass


class ServerState:
    """The app's sockets, the requests in progress (rid -> Job) and the metrics."""

    def __init__(self, ch: Channels, model_name: str, max_context: int):
        self.ch = ch
        self.model_name = model_name
        self.max_context = max_context
        self.jobs: dict[int, Job] = {}
        self.rids = count()
        self.metrics = ServerMetrics()
        self.failed: str | None = None  # a worker died: every request gets this error
        self.created = int(time.time())

    async def start(self) -> None:
        ctx = zmq.asyncio.Context()
        self.to_tokenizers = push(ctx, self.ch.tokenizer, bind=True)
        self.to_scheduler = push(ctx, self.ch.scheduler)
        self.inbox = pull(ctx, self.ch.app)
        self._receiver = asyncio.create_task(self._receive())

    async def _receive(self) -> None:
        while True:
            msg = await self.inbox.recv_pyobj()
            if isinstance(msg, TextBatch):
                if msg.stats is not None:
                    self.metrics.stats = msg.stats
                    if msg.stats.kv_check is not None:
                        self.metrics.kv_check = msg.stats.kv_check
                outs = msg.outs
            else:  # an ErrorOut from a tokenizer
                outs = [msg]
            for o in outs:
                if isinstance(o, TextOut) and o.error is not None:  # rejected by the scheduler
                    o = ErrorOut(o.rid, 400, o.error)
                job = self.jobs.get(o.rid)
                if job is not None:  # else its client is gone
                    job.queue.put_nowait(o)

    def fail(self, message: str) -> None:
        """A worker died: the requests in progress end with this error (HTTP 503)."""
        self.failed = message
        for rid, job in list(self.jobs.items()):
            job.queue.put_nowait(ErrorOut(rid, 503, message))

    async def submit(self, http: Request, make_req, received: float) -> "Job":
        """received: when the handler got the request (perf_counter), before its body was read."""
        if self.failed:
            raise P.ApiError(503, self.failed)
        rid = next(self.rids)
        req: GenerateReq = make_req(rid)
        req.received = received
        job = Job(self, rid, http)
        self.jobs[rid] = job
        await self.to_tokenizers.send_pyobj(req)
        return job

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise P.ApiError(404, f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                             "model", "model_not_found")


#: put in a job's queue when its client goes away: the queue is the one thing a job waits on
GONE = object()


class Job:
    """One request in progress: its outputs arrive in `queue`; `next()` waits for the next one
    or for the client to go away (ClientGone)."""

    def __init__(self, state: ServerState, rid: int, http: Request):
        self.state, self.rid = state, rid
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t0 = time.perf_counter()
        self.t_last: float | None = None
        self.tokens = 0
        self.ended = False
        self._held = None  # taken from the queue but not merged: what next() returns next
        self.gone = asyncio.ensure_future(self._disconnect(http))

    async def _disconnect(self, http: Request) -> None:
        while (await http.receive())["type"] != "http.disconnect":  # the body is read already
            pass
        self.queue.put_nowait(GONE)

    async def next(self) -> TextOut | ErrorOut:
        """The next output; when several have queued (the stream fell behind the engine), their
        text as one output, as vLLM's server merges what its consumer has not taken yet: at
        saturation one event per token per request is more than one process can write."""
        out, self._held = (self._held, None) if self._held is not None else (await self.queue.get(), None)
        while isinstance(out, TextOut) and out.finish_reason is None and not self.queue.empty():
            nxt = self.queue.get_nowait()
            if not isinstance(nxt, TextOut):  # an error or GONE: the text before it goes first
                self._held = nxt
                break
            out = dataclasses.replace(nxt, text=out.text + nxt.text)
        if out is GONE:
            raise ClientGone
        if isinstance(out, ErrorOut):
            self.ended = True
        else:
            self._observe(out)
        return out

    def _observe(self, o: TextOut) -> None:
        m, t = self.state.metrics, time.perf_counter()
        new = o.completion_tokens - self.tokens
        if new > 0:
            if self.t_last is None:
                m.ttft.observe(t - self.t0)
                new -= 1
            if new > 0:
                m.itl.observe((t - self.t_last) / new if self.t_last is not None else 0.0, new)
            self.t_last, self.tokens = t, o.completion_tokens
        if o.finish_reason is not None:
            self.ended = True
            m.finished[o.finish_reason] = m.finished.get(o.finish_reason, 0) + 1
            m.prompt_tokens += o.prompt_tokens
            m.generation_tokens += o.completion_tokens

    async def close(self) -> None:
        """Done with it: if it has not ended (its client went away), the scheduler aborts it."""
        self.gone.cancel()
        self.state.jobs.pop(self.rid, None)
        if not self.ended:
            self.ended = True
            await self.state.to_scheduler.send_pyobj(Abort(self.rid))


def error_response(e: P.ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Api:
    """One HTTP API's shapes: its body, its request, its chunks and its full response."""

    def __init__(self, body_cls, make_req, chunk, full, id_prefix: str, chunk_object: str):
        self.body_cls, self.make_req, self.chunk, self.full = body_cls, make_req, chunk, full
        self.id_prefix, self.chunk_object = id_prefix, chunk_object


def _usage(o: TextOut) -> dict:
    return {"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
            "total_tokens": o.prompt_tokens + o.completion_tokens}


def _completion_chunk(head, o: TextOut, first: bool) -> dict:
    return {**head, "object": "text_completion",
            "choices": [{"index": 0, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}]}


def _completion_full(head, text: str, last: TextOut) -> dict:
    return {**head, "object": "text_completion", "usage": _usage(last),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}]}


def _chat_chunk(head, o: TextOut, first: bool) -> dict:
    delta = {"role": "assistant", "content": o.text} if first else ({"content": o.text} if o.text else {})
    return {**head, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": o.finish_reason}]}


def _chat_full(head, text: str, last: TextOut) -> dict:
    return {**head, "object": "chat.completion", "usage": _usage(last),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": last.finish_reason}]}


COMPLETIONS = Api(P.CompletionBody, P.completion_req, _completion_chunk, _completion_full, "cmpl", "text_completion")
CHAT = Api(P.ChatBody, P.chat_req, _chat_chunk, _chat_full, "chatcmpl", "chat.completion.chunk")


def make_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        await state.start()
        yield

    app = FastAPI(title="testbed", lifespan=lifespan)

    @app.exception_handler(P.ApiError)
    async def api_error(request, e: P.ApiError):
        return error_response(e)

    @app.get("/health")
    async def health():
        if state.failed:
            return JSONResponse({"status": "failed", "error": state.failed}, status_code=503)
        c = state.metrics.kv_check
        if c is not None and not c.ok:
            return JSONResponse({"status": "failed", "error": f"KV integrity check at idle failed: {c.error}"},
                                status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "testbed", "max_model_len": state.max_context}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openai(http: Request, api: Api):
        received = time.perf_counter()
        b = P.validate(api.body_cls, P.parse_json(await http.body()))
        state.check_model(b.model)
        job = await state.submit(http, lambda rid: api.make_req(rid, b), received)
        head = {"id": f"{api.id_prefix}-{job.rid}", "created": int(time.time()), "model": state.model_name}
        include_usage = bool(b.stream_options and b.stream_options.include_usage)
        return await respond(job, b.stream, lambda o, first: sse(api.chunk(head, o, first)),
                             lambda text, last: api.full(head, text, last),
                             lambda last: sse({**head, "object": api.chunk_object, "choices": [],
                                               "usage": _usage(last)}) if include_usage else "")

    @app.post("/v1/completions")
    async def completions(http: Request):
        return await openai(http, COMPLETIONS)

    @app.post("/v1/chat/completions")
    async def chat(http: Request):
        return await openai(http, CHAT)

    @app.post("/generate")
    async def generate(http: Request):
        received = time.perf_counter()
        b = P.validate(P.GenerateBody, P.parse_json(await http.body()))
        job = await state.submit(http, lambda rid: P.generate_req(rid, b), received)
        text = []

        def meta(o: TextOut) -> dict:
            return {"id": job.rid, "prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
                    "finish_reason": {"type": o.finish_reason} if o.finish_reason else None}

        def chunk(o: TextOut, first: bool) -> str:  # SGLang streams the text so far
            text.append(o.text)
            return sse({"text": "".join(text), "meta_info": meta(o)})
        return await respond(job, b.stream, chunk, lambda t, last: {"text": t, "meta_info": meta(last)},
                             lambda last: "")

    return app


async def respond(job: Job, stream: bool, chunk, full, usage_chunk):
    """Wait for the request's first output (an error there is the HTTP error), then stream its
    outputs as server-sent events, or gather them into one JSON response."""
    try:
        first = await job.next()
    except ClientGone:
        await job.close()
        return JSONResponse({}, status_code=499)  # no one reads it
    except BaseException:
        await job.close()
        raise
    if isinstance(first, ErrorOut):
        await job.close()
        return error_response(P.ApiError(first.status, first.message, first.param))
    if not stream:
        try:
            outs = [first]
            while outs[-1].finish_reason is None:
                o = await job.next()
                if isinstance(o, ErrorOut):
                    return error_response(P.ApiError(o.status, o.message, o.param))
                outs.append(o)
            return JSONResponse(full("".join(o.text for o in outs), outs[-1]))
        except ClientGone:
            return JSONResponse({}, status_code=499)
        finally:
            await job.close()

    async def events():
        try:
            o, is_first = first, True
            while True:
                yield chunk(o, is_first)
                if o.finish_reason is not None:
                    yield usage_chunk(o)
                    break
                is_first = False
                o = await job.next()
                if isinstance(o, ErrorOut):  # mid-stream: the error is the last event
                    yield sse(P.ApiError(o.status, o.message, o.param).body())
                    break
            yield "data: [DONE]\n\n"
        except ClientGone:
            pass
        finally:
            await job.close()
    return StreamingResponse(events(), media_type="text/event-stream")
