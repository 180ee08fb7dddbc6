"""The detokenizer process: the scheduler's token batches in, the app's text out, per
request an IncrementalText and its StopStrings. A stop string found ends the request here
(finish_reason stop) and asks the scheduler to end it too, freeing its KV."""
from __future__ import annotations

from dataclasses import dataclass, field

import zmq

from testbed.serve.channels import Channels, pull, push
from testbed.serve.detokenize import IncrementalText, StopStrings
from testbed.serve.messages import Abort, DetokenizeReq, TextBatch, TextOut, TokenBatch, TokenOut
from testbed.serve.process import worker_main

FINISH = {"length": "length", "eos": "stop", "stop": "stop", "abort": "abort"}  # the scheduler's -> OpenAI's


@dataclass
class Stream:
    prompt_tokens: int
    text: IncrementalText
    stops: StopStrings
    tokens: int = 0
    stopped: bool = False  # a stop string ended it; the scheduler's end is still to come
    early: list = field(default_factory=list)


class Detokenizer:
    def __init__(self, tokenizer, to_scheduler: zmq.Socket):
        self.tok = tokenizer
        self.to_scheduler = to_scheduler
        self.streams: dict[int, Stream] = {}
        # tokens that came before their DetokenizeReq (two senders: no order between them)
        self.early: dict[int, list[TokenOut]] = {}

    def register(self, m: DetokenizeReq) -> list[TextOut]:
        self.streams[m.rid] = Stream(m.prompt_tokens, IncrementalText(self.tok), StopStrings(m.stop))
        outs = []
        for o in self.early.pop(m.rid, []):
            outs += self.tokens(o)
        return outs

    def batch(self, outs: list[TokenOut]) -> list[list[TextOut]]:
        """A step's token batch as the text messages to send, in order: its requests' first
        tokens ahead of the rest when it has both (at saturation a step holds hundreds of
        streams: decoding and writing them all before a first token put milliseconds into TTFT)."""
        first, later = [], []
        for o in outs:
            s = self.streams.get(o.rid)
            (first if s is not None and s.tokens == 0 and o.new_ids else later).append(o)
        if first and later:
            return [[t for o in first for t in self.tokens(o)], [t for o in later for t in self.tokens(o)]]
        return [[t for o in outs for t in self.tokens(o)]]

    def tokens(self, o: TokenOut) -> list[TextOut]:
        s = self.streams.get(o.rid)
        if s is None:
            self.early.setdefault(o.rid, []).append(o)
            return []
        if o.finish_reason is not None:
            del self.streams[o.rid]
        if s.stopped:  # already ended here: the scheduler's last tokens and its end are dropped
            return []
        if o.finish_reason == "rejected":
            return [TextOut(o.rid, "", s.prompt_tokens, 0, None, o.reject_reason)]
        text, stopped = "", False
        if o.new_ids:
            s.tokens += len(o.new_ids)
            text, stopped = s.stops.add(s.text.add(o.new_ids))
        if stopped:
            s.stopped = True
            if o.finish_reason is None:
                self.to_scheduler.send_pyobj(Abort(o.rid, "stop"))
            return [TextOut(o.rid, text, s.prompt_tokens, s.tokens, "stop")]
        finish = FINISH[o.finish_reason] if o.finish_reason else None
        if finish is not None:  # the held-back tail (a partial stop string, an incomplete character)
            tail, stopped = s.stops.add(s.text.flush())
            text += tail if stopped else tail + s.stops.flush()
            finish = "stop" if stopped else finish
        if not text and finish is None:
            return []
        return [TextOut(o.rid, text, s.prompt_tokens, s.tokens, finish)]


def run(ch: Channels, tokenizer_dir: str, ready) -> None:
    from testbed.serve.tokenizer_worker import load_tokenizer
    tok = load_tokenizer(tokenizer_dir)
    ctx = zmq.Context()
    inbox = pull(ctx, ch.detokenizer)
    to_app = push(ctx, ch.app)
    d = Detokenizer(tok, push(ctx, ch.scheduler))
    ready()
    while True:
        msg = inbox.recv_pyobj()
        if isinstance(msg, DetokenizeReq):
            outs, stats = d.register(msg), None
        elif isinstance(msg, TokenBatch):
            *ahead, outs = d.batch(msg.outs)
            for head in filter(None, ahead):  # first tokens that made no text yet (half a character) wait
                to_app.send_pyobj(TextBatch(head, None))
            stats = msg.stats
        else:
            raise TypeError(f"detokenizer inbox: unexpected message {type(msg).__name__}")
        if outs or stats is not None:
            to_app.send_pyobj(TextBatch(outs, stats))


def main(ch: Channels, tokenizer_dir: str, conn) -> None:
    worker_main("detokenizer", conn, run, ch, tokenizer_dir)
