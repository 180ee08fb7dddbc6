"""One POST whose reply is a stream of server-sent events, over a bare asyncio connection.

Why not httpx or aiohttp: at a server's saturation the client reads tens of thousands of
events a second, and a general client's layers cost 40-55 us of CPU an event (httpx: h11,
httpcore, anyio, line decoding; aiohttp 30-40 us) on the H200 machine's cores, which put the
replaying client at 87% of a core at 28 req/s and its own queueing into every TTFT it
measured. Here the connection's `data_received` parses the bytes as they come (the status
line and headers, chunked or length-framed body, `data:` lines) and hands each event to a
callback at once: no task wakes up per event. HTTP/1.1, one connection a request
(`Connection: close`), http and https, no proxies or redirects: what replaying a trace
against an OpenAI-compatible server needs.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Callable
from urllib.parse import urlsplit


class StreamError(Exception):
    """The connection failed, the server broke the protocol, or it sent nothing for too long;
    the message says which."""


class Reply:
    """What came: the status, and the body unless the status was 200 (then the events went to
    on_event as they came)."""

    def __init__(self):
        self.status = 0
        self.body = bytearray()


class _Connection(asyncio.Protocol):
    def __init__(self, request: bytes, on_event: Callable[[bytes], bool], done: asyncio.Future, timeout_s: float):
        self.request, self.on_event, self.done, self.timeout_s = request, on_event, done, timeout_s
        self.reply = Reply()
        self.buf = bytearray()  # bytes not parsed yet
        self.framing = None  # "chunked", "length", "close" once the headers are in
        self.left = 0  # length framing: body bytes still to come; chunked: of the current chunk (-1: its size line)
        self.lines = bytearray()  # the decoded body's bytes not yet split into lines
        self.transport = None
        self.last = time.monotonic()
        self.timer = None

    # ---- asyncio's callbacks ---------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.done.done():
            return
        self.buf += data
        try:
            if self.framing is None and not self._head():
                return
            self._body()
        except StreamError as e:
            self._end(e)

    def eof_received(self):
        if self.framing == "close" and not self.done.done():  # the body ran to the connection's end
            self._flush_lines(final=True)
            self._end(None)
        return False

    def connection_lost(self, exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not self.done.done():
            if self.framing == "close" and exc is None:
                self._flush_lines(final=True)
                self._end(None)
            else:
                self._end(StreamError(f"the server closed the connection mid-reply"
                                      + (f" ({type(exc).__name__}: {exc})" if exc else "")))

    # ---- parsing ---------------------------------------------------------------------------
    def _head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > 65536:
                raise StreamError("the server's reply headers are over 64 KiB")
            return False
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[:end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise StreamError(f"not an HTTP reply: {lines[0][:80]!r}")
        self.reply.status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.framing, self.left = "chunked", -1
        elif "content-length" in headers:
            self.framing, self.left = "length", int(headers["content-length"])
        else:
            self.framing = "close"
        return True

    def _body(self) -> None:
        buf = self.buf
        if self.framing == "chunked":
            while buf:
                if self.left < 0:  # a chunk's size line
                    eol = buf.find(b"\r\n")
                    if eol < 0:
                        return
                    size = buf[:eol].split(b";", 1)[0].strip()
                    try:
                        self.left = int(size, 16)
                    except ValueError:
                        raise StreamError(f"a bad chunk size {bytes(size[:20])!r}") from None
                    del buf[:eol + 2]
                    if self.left == 0:  # the last chunk (trailers are not read)
                        self._flush_lines(final=True)
                        self._end(None)
                        return
                elif len(buf) < self.left + 2:  # the chunk and its CRLF are not all in
                    if len(buf) > self.left:
                        return
                    self._take(buf)
                    self.left -= len(buf)
                    buf.clear()
                else:
                    self._take(buf[:self.left])
                    del buf[:self.left + 2]
                    self.left = -1
                if self.done.done():
                    return
        elif self.framing == "length":
            n = min(len(buf), self.left)
            self._take(buf[:n])
            self.left -= n
            buf.clear()
            if self.left <= 0 and not self.done.done():
                self._flush_lines(final=True)
                self._end(None)
        else:
            self._take(buf)
            buf.clear()

    def _take(self, data) -> None:
        """Decoded body bytes: gathered whole for an error status, else split into events."""
        if self.reply.status != 200:
            self.reply.body += data
            return
        self.lines += data
        self._flush_lines(final=False)

    def _flush_lines(self, final: bool) -> None:
        if self.reply.status != 200:
            return
        lines = self.lines
        start = 0
        while not self.done.done():
            eol = lines.find(b"\n", start)
            if eol < 0:
                break
            line = lines[start:eol]
            start = eol + 1
            if line.startswith(b"data:") and not self.on_event(bytes(line[5:]).strip()):
                self._end(None)  # the caller has what it wanted ([DONE], or an error event)
        del lines[:start]
        if final and lines.startswith(b"data:") and not self.done.done():
            self.on_event(bytes(lines[5:]).strip())
            lines.clear()

    # ---- ending ----------------------------------------------------------------------------
    def _end(self, error: StreamError | None) -> None:
        if self.done.done():
            return
        if error is None:
            self.done.set_result(self.reply)
        else:
            self.done.set_exception(error)
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()

    def _arm(self) -> None:
        if self.done.done():
            return
        delay = self.last + self.timeout_s - time.monotonic()
        if delay <= 0:
            self._end(StreamError(f"timed out (nothing from the server for {self.timeout_s:g} s)"))
            return
        self.timer = asyncio.get_running_loop().call_later(delay, self._arm)


async def post_events(url: str, body: dict, on_event: Callable[[bytes], bool], timeout_s: float) -> Reply:
    """POST `body` as JSON to `url`; each `data:` line of a 200 reply goes to on_event (its
    payload, stripped) as it comes, until on_event returns False or the reply ends. Raises
    StreamError: no connection in timeout_s, nothing from the server for timeout_s, a broken
    reply."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise StreamError(f"not an http(s) URL: {url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    payload = json.dumps(body).encode()
    host = u.hostname if u.port is None else f"{u.hostname}:{u.port}"
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: testbed\r\nAccept: text/event-stream\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
               ).encode("latin-1") + payload
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    tls = ssl.create_default_context() if u.scheme == "https" else None
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(request, on_event, done, timeout_s), u.hostname, port,
                                   ssl=tls), timeout_s)
    except asyncio.TimeoutError:
        raise StreamError(f"timed out (no connection to {u.hostname}:{port} in {timeout_s:g} s)") from None
    except OSError as e:
        raise StreamError(f"{type(e).__name__}: {e}") from None
    try:
        return await done
    finally:
        if not done.done():  # cancelled (Ctrl-C): the closing connection must not set it unread
            done.cancel()
        transport.close()
