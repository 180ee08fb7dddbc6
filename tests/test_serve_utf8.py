"""UTF-8 end to end through the streaming endpoints: a prompt with CJK and an emoji, and an
output of 3- and 4-byte characters, each byte one token of the byte-level tokenizer, so
every character of the reply is split over several tokens and decode steps. The model's
weights are set so that greedy decoding repeats the bytes of "世界😀", after a prompt ending
in one of them or in a newline (the chat template's end; tests/engine_fixtures.py
save_cycling_chat_model): the reply is known exactly, and no streamed chunk may hold a
replacement character (U+FFFD) or a piece of a character."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
import httpx  # noqa: E402

from engine_fixtures import save_cycling_chat_model  # noqa: E402
from serve_fixtures import Server  # noqa: E402

pytestmark = pytest.mark.slow
CYCLE = "世界😀"  # 3 + 3 + 4 bytes, all different
REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("cycling") / "model"
    save_cycling_chat_model(d, CYCLE)
    s = Server(d, tmp_path_factory.mktemp("served") / "run", "engine.num_pages=1024")
    yield s
    s.kill()


def streamed_texts(server, path: str, body: dict) -> list[str]:
    texts = []
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"]
                if c:
                    texts.append(c[0].get("text") if "text" in c[0] else c[0]["delta"].get("content") or "")
    return texts


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_multibyte_characters_stream_whole(server, path):
    n = 3 * len(CYCLE.encode())  # three rounds: 30 tokens
    common = {"max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    if path == "/v1/completions":  # ends with the emoji's last byte: the next is the first of 世
        body = {**common, "prompt": "héllo, 你好 and 😀"}
    else:  # the chat template ends with "assistant" and a newline: the next is the first of 世
        body = {**common, "messages": [{"role": "user", "content": "你好 😀"}]}
    texts = streamed_texts(server, path, body)
    assert all(REPLACEMENT not in t for t in texts), texts
    # every chunk is whole characters: it encodes to bytes that decode alone
    assert all(t.encode().decode() == t for t in texts)
    assert "".join(texts) == CYCLE * 3
    # How many chunks is timing: the server merges outputs its reader has not taken yet
    # (app.py), so a loaded machine may send "世界" as one. That each character goes out as
    # soon as its last byte is decoded is asserted without timing in test_serve_text.py.
    assert texts and all(t for t in texts[:-1])  # no empty chunk before the end
