"""A stand-in OpenAI-compatible server for the client's tests (backend=http): it streams
/v1/completions as vLLM does, and misbehaves on cue, by the prompt's first token id:
1 -> HTTP 500 with an OpenAI error; 2 -> hangs after its first chunk (counted as hanging once the client
has surely read it) until the client goes;
3 -> closes the connection mid-stream; 4 -> an error event mid-stream; else (a text prompt too) it streams
max_tokens chunks, DELAY_S apart, then usage. GET /stats: requests seen, completed, hanging,
and the most in flight at once. Run: python tests/fake_openai_server.py PORT"""
from __future__ import annotations

import asyncio
import json
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

DELAY_S = 0.02


def unread_bound() -> int:
    """More bytes than loopback can hold unread (the kernel's largest send and receive buffers,
    plus room for the server's own): once a stream has sent this much after an event, the client
    has read that event."""
    try:
        sizes = [int(open(f"/proc/sys/net/ipv4/tcp_{k}").read().split()[2]) for k in ("rmem", "wmem")]
    except (OSError, ValueError, IndexError):
        sizes = [32 << 20, 32 << 20]
    return sum(sizes) + (8 << 20)


PAD = ": " + "x" * ((64 << 10) - 3) + "\n"  # an SSE comment line of 64 KiB: the client skips it
app = FastAPI()
stats = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "hanging": 0, "completed": 0, "text_prompts": []}


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": "fake", "object": "model"}]}


@app.get("/stats")
async def get_stats():
    return stats


@app.post("/v1/completions")
async def completions(http: Request):
    body = await http.json()
    stats["requests"] += 1
    prompt, n = body["prompt"], body["max_tokens"]
    if isinstance(prompt, str):  # a text prompt is served as it comes
        stats["text_prompts"].append(prompt)
    cue = prompt[0] if isinstance(prompt, list) else 0
    if cue == 1:
        return JSONResponse({"error": {"message": "the fake server failed", "type": "server_error"}}, 500)
    rid = f"cmpl-fake-{stats['requests']}"

    def chunk(text, finish=None):
        return sse({"id": rid, "object": "text_completion", "choices": [{"index": 0, "text": text,
                                                                         "finish_reason": finish}]})

    async def events():
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            for i in range(n):
                await asyncio.sleep(DELAY_S)
                yield chunk("x", "length" if i == n - 1 else None)
                if cue == 2:  # no fixed wait: the padding cannot all be sent before the client reads the chunk
                    for _ in range(unread_bound() // len(PAD) + 1):
                        yield PAD
                    stats["hanging"] += 1
                    await asyncio.sleep(3600)
                if cue == 3 and i == 1:
                    raise RuntimeError("the fake server drops the connection")
                if cue == 4 and i == 1:
                    yield sse({"error": {"message": "the fake engine died", "type": "server_error"}})
                    yield "data: [DONE]\n\n"
                    return
            yield sse({"id": rid, "object": "text_completion", "choices": [],
                       "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                                 "total_tokens": len(body["prompt"]) + n}})
            yield "data: [DONE]\n\n"
            stats["completed"] += 1
        finally:
            stats["in_flight"] -= 1
    return StreamingResponse(events(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
