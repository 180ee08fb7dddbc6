"""One request: POST it, read its server-sent events, and note on the record when each
chunk came. As `vllm bench serve` counts: TTFT is the first chunk with a choice (its text
may be empty), every later such chunk is one inter-token gap, E2E ends at the last one, and
the output length is the server's usage.completion_tokens. An HTTP error, a connection
error, a timeout, an error event mid-stream or a stream without usage fails the request with
that error (what had come before it stays on the record). Each event is taken as its bytes
arrive (testbed.client.sse_post), so its time is when it came, not when a task got to it."""
from __future__ import annotations

import json

from testbed.client.record import ClientRecord
from testbed.client.sse_post import StreamError, post_events


async def send(url: str, body: dict, rec: ClientRecord, clock, timeout_s: float) -> None:
    rec.state, rec.sent = "RUNNING", clock()
    got = {"usage": None, "ended": False, "failed": None}  # [DONE] came; why the stream failed

    def on_event(data: bytes) -> bool:
        if data == b"[DONE]":
            got["ended"] = True
            return False
        try:
            event = json.loads(data)
        except json.JSONDecodeError as e:
            got["failed"] = f"an event that is not JSON: {e}"
            return False
        if event.get("error"):
            got["failed"] = f"error event mid-stream: {_error_text(data)}"
            return False
        if rec.response_id is None and event.get("id") is not None:
            rec.response_id = str(event["id"])
        if event.get("choices"):
            t = clock()
            if rec.first_token is None:
                rec.first_token = t
            rec.token_times.append(t)
            rec.finish = t
            rec.finish_reason = event["choices"][0].get("finish_reason") or rec.finish_reason
        if event.get("usage"):
            got["usage"] = event["usage"]
        return True

    try:
        reply = await post_events(url, body, on_event, timeout_s)
    except StreamError as e:
        rec.fail(str(e))
        return
    usage = got["usage"]
    if reply.status != 200:
        rec.fail(f"HTTP {reply.status}: {_error_text(bytes(reply.body))}")
    elif got["failed"]:
        rec.fail(got["failed"])
    elif not got["ended"]:
        rec.fail("the stream ended without [DONE]")
    elif rec.first_token is None:
        rec.fail("no chunk with a choice came (no first token)")
    elif usage is None or usage.get("completion_tokens") is None:
        rec.fail("the server sent no usage (stream_options.include_usage), so the output length is unknown")
    else:
        rec.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(usage["prompt_tokens"])
        rec.state = "ABORTED" if rec.finish_reason == "abort" else "FINISHED"  # ours, when it shuts down


def _error_text(raw: bytes) -> str:
    """An OpenAI-style error's message, else the body's start."""
    text = raw.decode(errors="replace")
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (json.JSONDecodeError, AttributeError):
        pass
    return text[:300] or "(empty body)"
