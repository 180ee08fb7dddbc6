"""One request: POST it, read its server-sent events, and note on the record when each
chunk came. As `vllm bench serve` counts: TTFT is the first chunk with a choice (its text
may be empty), every later such chunk is one inter-token gap, E2E ends at the last one, and
the output length is the server's usage.completion_tokens. An HTTP error, a connection
error, a timeout, an error event mid-stream or a stream without usage fails the request with
that error (what had come before it stays on the record)."""
from __future__ import annotations

import json

import httpx

from testbed.client.record import ClientRecord


async def send(client: httpx.AsyncClient, url: str, body: dict, rec: ClientRecord, clock) -> None:
    rec.state, rec.sent = "RUNNING", clock()
    usage = None
    ended = False  # [DONE] came
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                rec.fail(f"HTTP {r.status_code}: {_error_text(await r.aread())}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments (pings)
                data = line[5:].strip()
                if data == "[DONE]":
                    ended = True
                    break
                event = json.loads(data)
                if event.get("error"):
                    rec.fail(f"error event mid-stream: {_error_text(data.encode())}")
                    return
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
                    usage = event["usage"]
    except httpx.TimeoutException as e:
        rec.fail(f"timed out ({type(e).__name__}: nothing from the server for {client.timeout.read} s)")
        return
    except httpx.HTTPError as e:
        rec.fail(f"{type(e).__name__}: {e}")
        return
    except json.JSONDecodeError as e:
        rec.fail(f"an event that is not JSON: {e}")
        return
    if not ended:
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
