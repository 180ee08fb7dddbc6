"""A tokenizer process: the app's requests in, token ids out to the scheduler (with what
the detokenizer needs to the detokenizer first). Renders chats with the model directory's
chat template and refuses, with an HTTP 400 to the app, what cannot run: an empty prompt,
ids outside the vocabulary, a prompt and max_tokens over the model's context."""
from __future__ import annotations

import time

import zmq

from testbed.serve.channels import Channels, pull, push
from testbed.serve.messages import DetokenizeReq, ErrorOut, GenerateReq, TokenizedReq
from testbed.serve.process import worker_main


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def load_tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def prompt_ids(tok, m: GenerateReq, vocab_size: int) -> list[int]:
    if m.messages is not None:
        if not getattr(tok, "chat_template", None):
            raise BadRequest("this model's tokenizer has no chat template; use /v1/completions", "messages")
        try:
            ids = tok.apply_chat_template(m.messages, add_generation_prompt=True, tokenize=True)
        except Exception as e:  # the template's own error (a role it does not know, ...)
            raise BadRequest(f"the chat template could not render these messages: {e}", "messages") from None
        if hasattr(ids, "keys"):  # a BatchEncoding (transformers >= 5)
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
    elif m.input_ids is not None:
        ids = list(m.input_ids)
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):  # min/max: C loops, a prompt's ids are thousands
            bad = next(i for i in ids if not 0 <= i < vocab_size)
            raise BadRequest(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})", "prompt")
    else:
        ids = tok(m.text)["input_ids"]
    if not ids:
        raise BadRequest("the prompt is empty", "prompt")
    return ids


def max_new_tokens(m: GenerateReq, prompt_len: int, max_context: int) -> int:
    n = m.max_tokens if m.max_tokens is not None else m.default_max_tokens
    if n is None:
        n = max_context - prompt_len  # the rest of the context
    if prompt_len + max(n, 1) > max_context:
        raise BadRequest(f"this model's maximum context length is {max_context} tokens; the request has "
                         f"{prompt_len} prompt tokens and asks for {n} more", "max_tokens")
    return n


def run(ch: Channels, tokenizer_dir: str, max_context: int, vocab_size: int, ready) -> None:
    tok = load_tokenizer(tokenizer_dir)
    ctx = zmq.Context()
    inbox = pull(ctx, ch.tokenizer, bind=False)
    to_sched, to_detok, to_app = push(ctx, ch.scheduler), push(ctx, ch.detokenizer), push(ctx, ch.app)
    ready()
    while True:
        m: GenerateReq = inbox.recv_pyobj()
        try:
            ids = prompt_ids(tok, m, vocab_size)
            n = max_new_tokens(m, len(ids), max_context)
        except BadRequest as e:
            to_app.send_pyobj(ErrorOut(m.rid, 400, str(e), e.param))
            continue
        done = time.perf_counter()
        to_detok.send_pyobj(DetokenizeReq(m.rid, len(ids), m.stop))
        to_sched.send_pyobj(TokenizedReq(m.rid, ids, n, m.sampling, m.ignore_eos, m.received, done))


def main(index: int, ch: Channels, tokenizer_dir: str, max_context: int, vocab_size: int, conn) -> None:
    worker_main(f"tokenizer-{index}", conn, run, ch, tokenizer_dir, max_context, vocab_size)
