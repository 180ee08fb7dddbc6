"""python -m testbed.serve end to end on the CPU: a tiny random Llama with a byte-level
tokenizer (tests/engine_fixtures.py), the real server in a subprocess, real HTTP requests.
Streams agree with whole responses, usage counts the tokens, stop strings and max_tokens end
requests as OpenAI says, bad requests get their 4xx, a client that goes away frees its KV,
50 concurrent streams complete, a dead worker takes the server down naming it, and Ctrl-C
writes the server's run."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
import httpx  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engine_fixtures import save_tiny_chat_model  # noqa: E402
from serve_fixtures import ROOT, Server, wait_for  # noqa: E402
from testbed.serve import protocol as P  # noqa: E402

pytestmark = pytest.mark.slow  # each server takes ~10 s to start on 2 cores
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("tinychat") / "model")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    s = Server(model_dir, tmp_path_factory.mktemp("served") / "run", "engine.num_pages=4096", "serve.idle_kv_check=true")
    yield s
    s.kill()


def post(server, path, body, timeout=60):
    return httpx.post(server.url + path, json=body, timeout=timeout)


def sse_events(server, path, body) -> list:
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 2048


def test_completion_streamed_and_whole_agree(server):
    body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 12, **GREEDY}
    whole = post(server, "/v1/completions", body).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length"
    assert whole["usage"] == {"prompt_tokens": 11, "completion_tokens": 12, "total_tokens": 23}  # a token a byte
    events = sse_events(server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks, usage = events[:-1], events[-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert len({c["id"] for c in events}) == 1 and events[0]["id"].startswith("cmpl-")


def test_chat_with_the_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    # the ChatML template: <|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n, specials one token each
    assert whole.usage.prompt_tokens == 1 + len("user\nWhat is the capital of France?") + 1 + 1 + 1 + len("assistant\n")
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_generate_streams_the_text_so_far(server):
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 6, **GREEDY}}
    whole = post(server, "/generate", body).json()
    assert whole["meta_info"]["completion_tokens"] == 6 and whole["meta_info"]["finish_reason"] == {"type": "length"}
    events = sse_events(server, "/generate", {**body, "stream": True})
    assert events[-1]["text"] == whole["text"]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(events, events[1:]))


def test_prompt_token_ids_and_seeded_sampling(server):
    base = {"prompt": [72, 101, 108], "max_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_p": 0.9,
            "top_k": 50}
    a, b = (post(server, "/v1/completions", {**base, "seed": 7}).json() for _ in range(2))
    assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["usage"]["prompt_tokens"] == 3
    others = {post(server, "/v1/completions", {**base, "seed": s}).json()["choices"][0]["text"] for s in range(8, 12)}
    assert len(others | {a["choices"][0]["text"]}) > 1  # different seeds, different draws


def test_a_stop_string_ends_the_request(server):
    body = {"prompt": "Once upon", "max_tokens": 40, **GREEDY}
    text = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    # a stop string from the middle of the greedy text, split across tokens and decodes
    k = next(k for k in range(4, len(text) - 2) if text.find(text[k:k + 2]) == k)
    stop = text[k:k + 2]
    r = post(server, "/v1/completions", {**body, "stop": [stop, "never appears"]}).json()
    assert r["choices"][0]["text"] == text[:k] and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] < 40
    events = sse_events(server, "/v1/completions", {**body, "stop": stop, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events) == text[:k]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    wait_for(lambda: server.metrics()["testbed_num_requests_running"] == 0, 30, "the stopped request to end")


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"model": "gpt-4", "prompt": "a"}, 404, "model"),
    ("/v1/completions", {"prompt": "a", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "a", "top_k": 0}, 400, "top_k"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "n": 2}, 400, "n"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [True, False]}, 400, "prompt"),  # not taken as ids 1 and 0
    ("/v1/completions", {"prompt": [2.0]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x" * 2100, "max_tokens": 4}, 400, "max_tokens"),  # over the 2048 context
    ("/v1/completions", {"prompt": "abc", "max_tokens": 2046}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}], "stop": 3}, 400, "stop"),
    ("/generate", {"sampling_params": {}}, 400, "text"),
    ("/generate", {"input_ids": [True]}, 400, "input_ids"),
])
def test_bad_requests_get_an_openai_error(server, path, body, status, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error" and err["param"] == param, err


@pytest.mark.parametrize("cls, body, message", [
    (P.CompletionBody, {"prompt": [1.5]}, "prompt: must be a string or a list of token ids (integers)"),
    (P.CompletionBody, {"prompt": {"a": 1}}, "prompt: must be a string or a list of token ids (integers)"),
    (P.GenerateBody, {"input_ids": "abc"}, "input_ids: must be a list of token ids (integers)"),
    (P.CompletionBody, {"prompt": "a", "stop": ["a", 3]}, "stop: must be a string or a list of strings"),
    (P.ChatBody, {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content: must be a string or a list of text parts"),
    (P.ChatBody, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "image_url", "image_url": {"url": "x"}}]}]},
     """messages.0.content: part 1 is of type 'image_url': only text parts ({"type": "text", "text": ...}) are served"""),
    (P.CompletionBody, {"prompt": "a", "temperature": float("inf")}, "temperature: Input should be a finite number"),
])
def test_a_field_of_the_wrong_type_is_named_plainly(cls, body, message):
    with pytest.raises(P.ApiError) as e:
        P.validate(cls, body)
    assert e.value.message == message


def test_a_second_server_into_a_served_directory_writes_nothing_there(server, model_dir):
    """Refused at start (the directory is in use), before Hydra would rewrite the first's .hydra/."""
    before = (server.out / ".hydra" / "overrides.yaml").read_bytes()
    p = subprocess.run([sys.executable, "-m", "testbed.serve", f"model.path={model_dir}", "engine.device=cpu",
                        "engine.dtype=float32", "serve.port=1", f"hydra.run.dir={server.out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and "is in use by another run" in p.stderr.strip().splitlines()[-1], p.stderr[-2000:]
    assert (server.out / ".hydra" / "overrides.yaml").read_bytes() == before


def test_a_client_gone_aborts_its_request_and_frees_its_kv(server):
    body = {"prompt": "a long one", "max_tokens": 2000, "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few events: it is running
        assert any(g.startswith("data: ") for g in got)
        m = server.metrics()
        assert m["testbed_num_requests_running"] == 1 and m["testbed_kv_pages_used"] > 0
        checks = m.get("testbed_kv_idle_checks_total", 0)  # those run before it started (not idle since)
    # closed mid-stream: the scheduler aborts it and its pages are free (none held by a request)
    wait_for(lambda: (m := server.metrics())["testbed_num_requests_running"] == 0
             and m["testbed_kv_pages_used"] == 0, 30, "the aborted request's KV to be freed")
    # idle again: the scheduler's integrity check ran (serve.idle_kv_check) and found every page in one place
    m = wait_for(lambda: (m := server.metrics()).get("testbed_kv_idle_checks_total", 0) > checks and m, 30,
                 "the KV integrity check at idle after the abort")
    assert m["testbed_kv_idle_check_ok"] == 1 and m["testbed_kv_idle_check_pages_in_use"] == 0, m
    assert m["testbed_kv_pages_free"] + m["testbed_kv_pages_cached"] == m["testbed_kv_pages_total"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_fifty_concurrent_streams_complete(server):
    async def one(client, i):
        body = {"prompt": f"request {i}", "max_tokens": 8 + i % 5, "stream": True, **GREEDY}
        text, finish = "", None
        async with client.stream("POST", server.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    c = json.loads(line[6:])["choices"][0]
                    text += c["text"]
                    finish = c["finish_reason"] or finish
        return finish

    async def all_of_them():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=50)) as client:
            return await asyncio.gather(*(one(client, i) for i in range(50)))
    assert asyncio.run(all_of_them()) == ["length"] * 50


def test_ctrl_c_writes_what_was_served(server):
    """Last in this module: it stops the module's server."""
    assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]
    assert "stopped; what was served is in" in server.log()
    summary = json.loads((server.out / "summary.json").read_text())
    assert summary["complete"] is True and summary["kv"]["integrity"]["in_use"] == 0
    assert summary["trace"]["name"] == "served"
    reqs = pq.read_table(server.out / "requests.parquet").to_pandas()
    assert len(reqs) == summary["trace"]["num_requests"] >= 60
    reasons = set(reqs["finish_reason"])
    assert {"length", "stop", "abort"} <= reasons, reasons  # max_tokens, a stop string, the client gone
    assert reqs["rid"].is_unique and (reqs.loc[reqs.finish_reason == "length", "output_tokens"]
                                      == reqs.loc[reqs.finish_reason == "length", "max_new_tokens"]).all()
    assert len(pq.read_table(server.out / "steps.parquet")) > 0
    # each request's stages on the run's clock: received by the app (arrival), tokenized, taken by the scheduler
    took = reqs[reqs.reject_reason.isna()]
    assert took[["tokenized_s", "queued_s"]].notna().all().all()
    cols = ["rid", "state", "arrival_s", "tokenized_s", "queued_s", "first_scheduled_s"]
    for name, ok in [("0 < arrival", 0 < took.arrival_s), ("arrival <= tokenized", took.arrival_s <= took.tokenized_s),
                     ("tokenized <= queued", took.tokenized_s <= took.queued_s)]:
        assert ok.all(), f"{name}:\n{took.loc[~ok, cols]}"
    ran = took[took.first_scheduled_s.notna()]  # (a request aborted while it waited never ran)
    late = ran.queued_s > ran.first_scheduled_s
    assert not late.any() and len(ran) >= 60, f"queued after first scheduled:\n{ran.loc[late, cols]}"
    assert summary["clock_origin_s"] > 0


def test_a_dead_worker_takes_the_server_down_naming_it(model_dir, tmp_path):
    s = Server(model_dir, tmp_path / "run", "serve.tokenizer_workers=2", "engine.num_pages=64")
    try:
        # a request the KV pool can never hold: the scheduler's rejection is a 400
        r = post(s, "/v1/completions", {"prompt": "abc", "max_tokens": 100})
        assert r.status_code == 400 and "KV pages" in r.json()["error"]["message"], r.text
        pid = int(re.search(r"tokenizer-1 \(pid (\d+)\) ready", s.log()).group(1))
        import os
        os.kill(pid, signal.SIGKILL)
        assert s.proc.wait(60) == 1
        assert re.search(rf"error: the tokenizer-1 process \(pid {pid}\) died \(killed by signal 9\); "
                         r"shutting the server down", s.log()), s.log()[-3000:]
        assert (tmp_path / "run" / "summary.json").is_file()  # the scheduler still wrote what it served
    finally:
        s.kill()
