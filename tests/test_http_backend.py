"""backend=http end to end: `python -m testbed.run backend=http` replays an azure_conv trace
against our server (tests/test_serve.py's tiny model, on the CPU) and its client-side
requests.parquet agrees with the server's own (written when the server is stopped): the
same requests, the trace's output lengths, and a client TTFT no shorter than the server's
(the difference is HTTP, tokenizing and detokenizing; printed)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engine_fixtures import save_tiny_chat_model  # noqa: E402
from serve_fixtures import ROOT, Server  # noqa: E402

pytestmark = pytest.mark.slow
N = 10  # azure_conv's first 10 requests arrive over 8.5 s


def replay(url: str, out, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "testbed.run", "backend=http", f"backend.url={url}",
            "trace=azure_conv", f"trace.num_requests={N}", "progress=false", f"hydra.run.dir={out}", *overrides]
    return subprocess.run(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=timeout)


def trace_output_lengths(model_dir) -> list[int]:
    from testbed import assemble
    from testbed.config import compose
    cfg = compose([f"model.path={model_dir}", "trace=azure_conv", f"trace.num_requests={N}"])
    return [t.output_len for t in assemble.trace_for(cfg, assemble.model_spec(cfg)).requests]


def test_a_replay_over_http_agrees_with_the_server(tmp_path):
    model_dir = save_tiny_chat_model(tmp_path / "model")
    server = Server(model_dir, tmp_path / "served", "engine.num_pages=8192")
    try:
        p = replay(server.url, tmp_path / "client", f"model.path={model_dir}")
        assert p.returncode == 0, p.stderr[-3000:]
        assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]
    finally:
        server.kill()
    summary = json.loads((tmp_path / "client" / "summary.json").read_text())
    assert summary["complete"] and summary["backend"] == "http" and summary["server"]["model"] == "tiny"
    m = summary["metrics"]
    assert m["completed"] == N and m["errors"] == 0 and m["preemptions"] is None
    client = pq.read_table(tmp_path / "client" / "requests.parquet").to_pandas()
    assert list(client["rid"]) == list(range(N)) and (client["state"] == "FINISHED").all()
    assert list(client["output_tokens"]) == trace_output_lengths(model_dir)  # ignore_eos: exactly the trace's
    assert (client["finish_reason"] == "length").all()
    assert len(pq.read_table(tmp_path / "client" / "steps.parquet")) == 0  # the server has the steps

    served = pq.read_table(tmp_path / "served" / "requests.parquet").to_pandas()
    served["response_id"] = [f"cmpl-{rid}" for rid in served["rid"]]
    both = client.merge(served, on="response_id", suffixes=("_client", "_server"), validate="one_to_one")
    assert len(both) == len(served) == N  # the same requests, nothing else
    assert (both["prompt_tokens_client"] == both["prompt_tokens_server"]).all()
    assert (both["output_tokens_client"] == both["output_tokens_server"]).all()
    # the client's clock starts before the HTTP request and stops after the chunk is read
    overhead = (both["ttft_s_client"] - both["ttft_s_server"]).to_numpy() * 1000
    assert (overhead >= 0).all(), overhead
    e2e_over = (both["e2e_s_client"] - both["e2e_s_server"]).to_numpy() * 1000
    assert (e2e_over >= 0).all(), e2e_over
    # both clocks lined up (one machine's CLOCK_MONOTONIC): each request was sent, then received by the
    # app, then taken by the scheduler; its first token was made on the server, then read by the client
    shift = summary["clock_origin_s"] - json.loads((tmp_path / "served" / "summary.json").read_text())["clock_origin_s"]
    sent = both["first_scheduled_s_client"] + shift
    assert (sent <= both["received_s_server"]).all() and (both["received_s_server"] <= both["arrival_s_server"]).all()
    assert (both["first_token_s_server"] <= both["first_token_s_client"] + shift).all()
    print(f"\nTTFT client - server, ms: median {np.median(overhead):.1f}, min {overhead.min():.1f}, "
          f"max {overhead.max():.1f}; E2E: median {np.median(e2e_over):.1f}; client mean TTFT "
          f"{m['mean_ttft_ms']:.1f} ms, ITL {m['mean_itl_ms']:.1f} ms")


def test_a_server_that_is_not_there_is_one_line(tmp_path):
    p = replay("http://127.0.0.1:9", tmp_path / "client", timeout=120)
    assert p.returncode == 2 and "backend.url='http://127.0.0.1:9': its /v1/models did not answer" in p.stderr
