"""Request bodies from a trace's requests: the prompt as the trace's token ids (a list of
ints, which OpenAI's /v1/completions accepts; ours, vLLM and SGLang do), or those ids
decoded to text by the tokenizer of the server's model (backend.prompt=text; the chat API
needs text). max_tokens is the trace's output length; with backend.ignore_eos the server is
asked for exactly that many (ignore_eos, min_tokens: vLLM's and SGLang's extensions)."""
from __future__ import annotations

from pathlib import Path

from testbed.core import SamplingParams

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def load_decoder(path: str):
    """ids -> text with the tokenizer.json at `path` (or in the folder `path`)."""
    from tokenizers import Tokenizer
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise FileNotFoundError(f"backend.tokenizer={path!r}: no tokenizer.json there")
    tok = Tokenizer.from_file(str(f))
    return lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False)


def request_body(api: str, model: str, prompt, max_tokens: int, sampling: SamplingParams, ignore_eos: bool) -> dict:
    """One streamed request (usage in its last chunk). prompt: a list of ids or a text."""
    body: dict = {"model": model, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True}, "temperature": sampling.temperature,
                  "seed": sampling.seed}
    if sampling.top_p < 1.0:
        body["top_p"] = sampling.top_p
    if sampling.top_k != -1:
        body["top_k"] = sampling.top_k
    if ignore_eos:
        body.update(ignore_eos=True, min_tokens=max_tokens)
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body
