"""backend=http's client against a stand-in server that misbehaves on cue
(tests/fake_openai_server.py): an HTTP error, a dropped connection and an error event each
fail their request with that error and the others finish; max_concurrency keeps that many
in flight, their wait outside TTFT; SIGTERM mid-run writes what came (exit 143)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from serve_fixtures import ROOT, default_sigint, free_port, wait_for  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def fake(tmp_path):
    port = free_port()
    log = open(tmp_path / "fake.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_openai_server.py"), str(port)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"the fake server exited: {(tmp_path / 'fake.log').read_text()}")
        try:
            return httpx.get(url + "/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for(up, 60, "the fake server")
    yield url
    proc.kill()
    proc.wait()
    log.close()


def trace(tmp_path, rows) -> str:
    """rows: (cue id, output tokens, arrival s); prompts of 3 ids starting with the cue."""
    path = tmp_path / "trace.csv"
    pd.DataFrame({"prompt_ids": [f"[{cue}, 10, 11]" for cue, _, _ in rows], "output_tokens": [n for _, n, _ in rows],
                  "arrival_s": [a for _, _, a in rows]}).to_csv(path, index=False)
    return str(path)


def replay_args(url, trace_path, out, *overrides):
    return [sys.executable, "-m", "testbed.run", "backend=http", f"backend.url={url}", "trace=file",
            f"trace.path={trace_path}", "model=smollm2_135m", "progress=false", f"hydra.run.dir={out}", *overrides]


def results(out):
    return json.loads((out / "summary.json").read_text()), pq.read_table(out / "requests.parquet").to_pandas()


def test_failed_requests_are_kept_with_their_error(fake, tmp_path):
    t = trace(tmp_path, [(5, 6, 0.0), (1, 6, 0.05), (3, 6, 0.1), (4, 6, 0.15), (6, 1, 0.2)])
    p = subprocess.run(replay_args(fake, t, tmp_path / "out"), cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    summary, req = results(tmp_path / "out")
    assert summary["complete"] and summary["server"]["model"] == "fake"
    assert list(req["state"]) == ["FINISHED", "FAILED", "FAILED", "FAILED", "FINISHED"]
    err = list(req["error"])
    assert pd.isna(err[0]) and err[1] == "HTTP 500: the fake server failed"
    assert err[2] == "the server closed the connection mid-reply", err[2]
    assert err[3] == "error event mid-stream: the fake engine died"
    assert list(req["output_tokens"])[0] == 6 and req["response_id"][0].startswith("cmpl-fake-")
    ok = req.iloc[0]
    assert len(ok["token_times_s"]) == 6 and ok["ttft_s"] == pytest.approx(ok["first_token_s"] - ok["first_scheduled_s"])
    assert ok["tpot_s"] == pytest.approx((ok["e2e_s"] - ok["ttft_s"]) / 5)
    assert pd.isna(req["tpot_s"][4])  # one token: no TPOT
    m = summary["metrics"]
    assert m["completed"] == 2 and m["errors"] == 3 and m["failed"] == 3 and m["unfinished"] == 0
    # the commonest errors, in summary.json and in the printed table
    assert sorted((e["error"], e["requests"]) for e in summary["request_errors"]) == sorted((e, 1) for e in err[1:4])
    assert "error" in p.stdout and "1 x HTTP 500: the fake server failed" in p.stdout


def test_max_concurrency_keeps_the_wait_out_of_ttft(fake, tmp_path):
    t = trace(tmp_path, [(5, 10, 0.0)] * 4)  # all at once, ~0.2 s each
    p = subprocess.run(replay_args(fake, t, tmp_path / "out", "backend.max_concurrency=1"), cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert httpx.get(fake + "/stats").json()["max_in_flight"] == 1
    _, req = results(tmp_path / "out")
    assert (req["state"] == "FINISHED").all() and (req["arrival_s"] == 0).all()
    q = sorted(req["queue_s"])
    assert q[0] < 0.1 and q[-1] > 0.4  # the last waited for three others
    assert (req["ttft_s"] < 0.5 * q[-1]).all()  # the wait is not in TTFT (vLLM's client_queue_time)
    assert (req["first_token_s"] - req["arrival_s"] >= req["ttft_s"]).all()


@pytest.mark.parametrize("sig, code, error", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                               (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
def test_a_signal_mid_run_writes_what_came(fake, tmp_path, sig, code, error):
    t = trace(tmp_path, [(5, 3, 0.0), (2, 5, 1.0), (5, 3, 60.0)])  # one finishes, then one hangs, one is far off
    proc = subprocess.Popen(replay_args(fake, t, tmp_path / "out"), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # Ctrl-C as from a terminal
    try:
        wait_for(lambda: (s := httpx.get(fake + "/stats").json())["hanging"] == 1 and s["completed"] == 1, 60,
                 "the first request's end and the hanging one's first chunk")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-3000:]
    summary, req = results(tmp_path / "out")
    assert summary["complete"] is False and summary["error"] == error
    assert list(req["state"]) == ["FINISHED", "RUNNING"]  # the third had not arrived
    assert not pd.isna(req["first_token_s"][1]) and req["output_tokens"][1] == 0


def test_text_prompts_are_the_ids_decoded(fake, tmp_path):
    pytest.importorskip("transformers")
    from engine_fixtures import save_byte_tokenizer
    save_byte_tokenizer(tmp_path / "tok")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    ids = tok.encode("héllo 世界").ids
    path = tmp_path / "trace.csv"
    pd.DataFrame({"prompt_ids": [json.dumps(ids)], "output_tokens": [4], "arrival_s": [0.0]}).to_csv(path, index=False)
    p = subprocess.run(replay_args(fake, path, tmp_path / "out", "backend.prompt=text",
                                   f"backend.tokenizer={tmp_path / 'tok'}"), cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert httpx.get(fake + "/stats").json()["text_prompts"] == ["héllo 世界"]
    _, req = results(tmp_path / "out")
    # the server's usage count (the fake counts characters: 8), not the trace's 13 byte tokens
    assert list(req["state"]) == ["FINISHED"] and list(req["prompt_tokens"]) == [len("héllo 世界")] != [len(ids)]
