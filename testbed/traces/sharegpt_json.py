"""`vllm bench`'s ShareGPT JSON as a user's file: a JSON array of conversations,
{"id": ..., "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}.

Each conversation is one request, as vllm bench samples them: the first human turn is the
prompt, the first gpt turn after it gives the output length. Conversations without such a
pair, or with an empty prompt or reply, are left out and counted. The file holds text, so
token counts come from a tokenizer (trace.tokenizer: a tokenizer.json, read with the
`tokenizers` package; its ids become the prompt's token ids) or, without one, from an
estimate, ceil(characters / trace.chars_per_token) with random ids.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from .assemble import Rows
from .base import Source, TraceError
from .config import TraceConfig
from .token_ids import unique_ids

PROMPT_ROLES = ("human", "user")
REPLY_ROLES = ("gpt", "assistant", "chatgpt")
_SPACE = re.compile(r"\s*")


def starts_as_array(path: Path) -> bool:
    """Whether the file's first character (after a byte-order mark and white space) is '['."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
    return head[:1] == b"["


def read_array(path: Path) -> list[tuple[int, object]]:
    """(line, value) of each entry of a top-level JSON array: the line is where the entry starts."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    decoder = json.JSONDecoder(parse_constant=str)
    at = _SPACE.match(text).end()
    if text[at:at + 1] != "[":
        raise TraceError(f"{path}: not a JSON array (the ShareGPT format is a list of conversations)")
    out, line, seen = [], 1, 0
    at = _SPACE.match(text, at + 1).end()
    if text[at:at + 1] == "]":
        return out
    while True:
        line += text.count("\n", seen, at)
        seen = at
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}, line {e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        out.append((line, value))
        at = _SPACE.match(text, end).end()
        sep = text[at:at + 1]
        if sep == "]":
            return out
        if sep != ",":
            n = line + text.count("\n", seen, at)
            raise TraceError(f"{path}, line {n}: invalid JSON (expected ',' or ']' after entry {len(out)})")
        at = _SPACE.match(text, at + 1).end()


def _pair(path: Path, line: int, n: int, entry) -> tuple[str, str] | None:
    """(prompt, reply) of one conversation, or None when it has no human turn followed by a gpt turn."""
    where = f"{path}, line {line} (entry {n})"
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: expected an object with 'conversations', got {type(entry).__name__}")
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        got = "missing" if turns is None else f"a {type(turns).__name__}"
        raise TraceError(f"{where}: field 'conversations' is {got}; need a list of {{'from', 'value'}} turns")
    prompt = None
    for t, turn in enumerate(turns):
        field = f"conversations[{t}]"
        if not isinstance(turn, dict):
            raise TraceError(f"{where}: field '{field}' is a {type(turn).__name__}, not an object")
        for key in ("from", "value"):
            if not isinstance(turn.get(key), str):
                got = "missing" if key not in turn else f"a {type(turn[key]).__name__}"
                raise TraceError(f"{where}: field '{field}.{key}' is {got}, not a string")
        role = turn["from"].lower()
        if prompt is None and role in PROMPT_ROLES:
            prompt = turn["value"]
        elif prompt is not None and role in REPLY_ROLES:
            return prompt, turn["value"]
    return None


def _tokenizer(spec: str):
    p = Path(spec).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TraceError(f"trace.tokenizer: {p} not found (give a tokenizer.json or the folder holding one)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TraceError("trace.tokenizer needs the 'tokenizers' package: pip install tokenizers") from None
    try:
        return Tokenizer.from_file(str(p)), p
    except Exception as e:  # the Rust reader raises its own exception type
        raise TraceError(f"trace.tokenizer: {p} is not a readable tokenizer.json ({' '.join(str(e).split())})") from None


def rows(path: Path, k: TraceConfig) -> Rows:
    entries = read_array(path)
    if not entries:
        raise TraceError(f"{path}: no conversations (an empty JSON array)")
    lines, prompts, replies = [], [], []
    for n, (line, entry) in enumerate(entries, 1):
        pair = _pair(path, line, n, entry)
        if pair is not None:
            lines.append(line)
            prompts.append(pair[0])
            replies.append(pair[1])
    notes = []
    if len(lines) < len(entries):
        notes.append(f"{len(entries) - len(lines)} of {len(entries)} conversations have no human turn followed "
                     f"by a gpt turn: left out")
    if not lines:
        raise TraceError(f"{path}: none of its {len(entries)} conversations has a human turn followed by a gpt turn")

    if k.tokenizer is not None:
        tok, tok_path = _tokenizer(k.tokenizer)
        # the prompt as an engine receives it (with the tokenizer's special tokens, as vllm bench
        # counts it), the reply as the tokens generated
        ids = [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(prompts, add_special_tokens=True)]
        out = np.array([len(e.ids) for e in tok.encode_batch(replies, add_special_tokens=False)], dtype=np.int64)
        prompt = np.array([len(x) for x in ids], dtype=np.int64)
        top = max((int(x.max()) for x in ids if len(x)), default=0)
        if top >= k.vocab_size:
            raise TraceError(f"trace.tokenizer: {tok_path} gives token id {top}, outside the model's vocabulary "
                             f"[0, {k.vocab_size}): use the model's own tokenizer")
        notes.append(f"token counts and prompt ids from the tokenizer {tok_path}")
    else:
        ids = None
        prompt = np.array([math.ceil(len(s) / k.chars_per_token) for s in prompts], dtype=np.int64)
        out = np.array([math.ceil(len(s) / k.chars_per_token) for s in replies], dtype=np.int64)
        notes.append(f"token counts estimated as ceil(characters / {k.chars_per_token:g}) (no trace.tokenizer); "
                     f"token ids seeded random (seed {k.seed}), independent per request")
    keep = np.flatnonzero((prompt > 0) & (out > 0))
    if len(keep) < len(prompt):
        notes.append(f"{len(prompt) - len(keep)} conversations have an empty prompt or reply (0 tokens): left out")
    if not len(keep):
        raise TraceError(f"{path}: every conversation has an empty prompt or reply")
    src = Source(str(path), "json", tuple(lines)).subset(keep)

    def make_ids(take, rids, lens):
        if ids is None:
            return unique_ids(k.seed, rids, lens, k.vocab_size)
        return [ids[keep[i]][:n].astype(np.int32) for i, n in zip(take, lens)]

    # no arrival times; shuffled before taking num_requests (trace.shuffle), as vllm bench samples it
    return Rows(src=src, prompt_len=prompt[keep], output_len=out[keep], make_ids=make_ids, shufflable=True,
                notes=notes)
