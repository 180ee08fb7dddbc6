"""The client's bare HTTP/1.1 streamed POST (testbed.client.sse_post) against a socket server
that sends exactly the bytes a test gives it, split where the test says."""
from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.client.sse_post import StreamError, post_events

EVENTS = [b'{"id": "a", "choices": [{"text": "h\\u00e9"}]}', b'{"choices": [{"text": "\xe4\xb8\x96"}]}',
          b'{"usage": {"completion_tokens": 2}}']


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for n in sizes:
        if i >= len(body):
            break
        part = body[i:i + n]
        out += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
        i += n
    if i < len(body):
        out += b"%X\r\n" % (len(body) - i) + body[i:] + b"\r\n"
    return out + b"0\r\n\r\n"


def sse_body(events=EVENTS, done=True) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events) + (b"data: [DONE]\n\n" if done else b"")


async def serve_bytes(reply: bytes, cuts: list[int], hold: bool = False):
    """A server that reads the request, then writes `reply` in pieces cut at `cuts` (each
    written on its own, with a pause between); hold: then keep the connection open until the client closes it."""
    seen = {}

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
        seen["head"], seen["body"] = head, await reader.readexactly(length)
        last = 0
        for c in sorted(set(cuts)) + [len(reply)]:
            if c > last:
                writer.write(reply[last:c])
                await writer.drain()
                await asyncio.sleep(0.001)
                last = c
        if hold:  # until the client closes it
            await reader.read()
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions", seen


def run_post(reply: bytes, cuts=(), timeout_s=10.0, hold=False, stop_at_done=True):
    got = []

    def on_event(data: bytes) -> bool:
        got.append(data)
        return not (stop_at_done and data == b"[DONE]")

    async def go():
        server, url, seen = await serve_bytes(reply, list(cuts), hold)
        async with server:
            r = await post_events(url, {"prompt": [1, 2], "max_tokens": 2}, on_event, timeout_s)
        return r, seen
    r, seen = asyncio.run(go())
    return r, got, seen


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_chunked_events_come_whole_however_the_bytes_are_cut(sizes, cuts):
    body = sse_body()
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(body, sizes)
    r, got, seen = run_post(reply, cuts)
    assert r.status == 200 and got == EVENTS + [b"[DONE]"]
    assert json.loads(seen["body"]) == {"prompt": [1, 2], "max_tokens": 2}
    assert seen["head"].startswith(b"POST /v1/completions HTTP/1.1\r\n") and b"Connection: close" in seen["head"]


@given(cuts=st.lists(st.integers(0, 300), max_size=6))
@settings(max_examples=20, deadline=None)
def test_length_framed_and_close_framed_bodies(cuts):
    body = sse_body(done=False) + b"data: last-without-newline"
    for head in (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body), b"HTTP/1.0 200 OK\r\n\r\n"):
        r, got, _ = run_post(head + body, cuts)
        assert r.status == 200 and got == EVENTS + [b"last-without-newline"]


def test_an_error_status_gives_its_body_and_no_events():
    err = b'{"error": {"message": "bad"}}'
    r, got, _ = run_post(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(err) + err, [20])
    assert r.status == 400 and bytes(r.body) == err and got == []


def test_the_caller_stops_the_stream_and_the_rest_is_not_read():
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(sse_body() + sse_body(), [30])
    r, got, _ = run_post(reply, hold=True)  # ends at the first [DONE], though the server holds on
    assert got == EVENTS + [b"[DONE]"]


def test_a_connection_closed_mid_reply_is_an_error():
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(sse_body(), [30])[:-20]
    with pytest.raises(StreamError, match="the server closed the connection mid-reply"):
        run_post(reply)


def test_silence_past_the_timeout_is_an_error():
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(sse_body(done=False), [30])[:-5]
    with pytest.raises(StreamError, match=r"timed out \(nothing from the server for 0.3 s\)"):
        run_post(reply, timeout_s=0.3, hold=True)


def test_no_server_and_bad_urls_are_one_line_errors():
    async def go(url):
        return await post_events(url, {}, lambda d: True, 5)
    with pytest.raises(StreamError, match="ConnectionRefusedError"):
        asyncio.run(go("http://127.0.0.1:9/v1/completions"))
    with pytest.raises(StreamError, match="not an http"):
        asyncio.run(go("ftp://x/y"))
    with pytest.raises(StreamError, match="not an HTTP reply"):
        run_post(b"SSH-2.0-OpenSSH\r\n\r\n")
