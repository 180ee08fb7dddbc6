"""The ZeroMQ endpoints of one server: one pull socket per receiving process, which every
sender connects a push socket to (a push socket round-robins over its peers: several
tokenizer workers share the app's requests)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import zmq


@dataclass(frozen=True)
class Channels:
    tokenizer: str  # app -> tokenizer workers
    scheduler: str  # tokenizers, app, detokenizer, launcher -> scheduler
    detokenizer: str  # tokenizers, scheduler -> detokenizer
    app: str  # detokenizer, tokenizers -> app

    @classmethod
    def in_dir(cls, d: str) -> "Channels":
        return cls(*(f"ipc://{os.path.join(d, name)}" for name in ("tokenizer", "scheduler", "detokenizer", "app")))


def pull(ctx: zmq.Context, addr: str, bind: bool = True) -> zmq.Socket:
    s = ctx.socket(zmq.PULL)
    s.bind(addr) if bind else s.connect(addr)
    return s


def push(ctx: zmq.Context, addr: str, bind: bool = False) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 2000)  # a last message (a shutdown, an end) still goes out when the process exits
    s.bind(addr) if bind else s.connect(addr)
    return s
