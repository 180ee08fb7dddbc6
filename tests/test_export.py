"""`python -m testbed.export DIR --format vllm|aiperf` end to end: simulated runs (one with
rejected requests, one cut short) and a committed engine run; every exported figure checked
against requests.parquet and summary.json; bad input is one line."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE_RUN = REPO / "benchmarks/results/fidelity/same_start_1201/runs/qwen3_0_6b-chunked-sharegpt-light/r1"
VLLM_KEYS = {  # what vllm bench serve --save-result writes (benchmarks/serve.py), less text and audio
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99"))}
DETAILED = {"input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors"}
AIPERF_METADATA = {"session_num", "x_request_id", "x_correlation_id", "conversation_id", "turn_index",
                   "request_start_ns", "request_ack_ns", "request_end_ns", "worker_id", "record_processor_id",
                   "benchmark_phase", "was_cancelled", "cancellation_time_ns"}


def export(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "testbed.export", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def ok(p):
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """50 synthetic requests on SmolLM2 (8k context): prompts up to 12k tokens, so some are rejected."""
    out = tmp_path_factory.mktemp("export") / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok(subprocess.run([sys.executable, "-m", "testbed.run", "model=smollm2_135m", "trace=synthetic",
                       "trace.num_requests=50", "trace.prompt_len_max=12000", "trace.output_len_max=64",
                       "slo.ttft_ms=8", "slo.e2e_ms=40", "progress=false", f"hydra.run.dir={out}"],
                      cwd=REPO, env=env, capture_output=True, text=True, timeout=300))
    return out


def test_vllm_result_agrees_with_the_run(run_dir):
    p = ok(export(run_dir, "--format", "vllm", "--percentiles", "50,90,99", "--detailed"))
    path = run_dir / "vllm_bench_result.json"
    assert p.stdout.strip() == f"wrote {path}" and p.stderr == ""
    r = json.loads(path.read_text())
    s = json.loads((run_dir / "summary.json").read_text())
    m, req = s["metrics"], pd.read_parquet(run_dir / "requests.parquet")
    assert VLLM_KEYS | DETAILED <= set(r)
    done = req[req["state"] == "FINISHED"]
    assert r["num_prompts"] == len(req) == 50 and r["completed"] == len(done) == m["completed"]
    assert r["failed"] == (req["state"] == "REJECTED").sum() == m["failed"] > 0
    for key in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "median_tpot_ms", "p90_itl_ms",
                "p99_e2el_ms", "std_ttft_ms"):
        assert r[key] == pytest.approx(m[key]), key
    assert r["duration"] == pytest.approx(m["duration_s"])
    assert 0 < r["request_goodput"] < r["request_throughput"]  # the SLOs are tight enough to miss some
    assert r["p50_ttft_ms"] == r["median_ttft_ms"]
    assert r["request_rate"] == s["config"]["trace"]["rate"] and r["burstiness"] == 1.0
    assert r["backend"] == "testbed-sim" and r["label"] == "testbed-sim-chunked" and r["model_id"] == "smollm2_135m"
    assert r["date"] == datetime.datetime.fromisoformat(s["started_at"]).strftime("%Y%m%d-%H%M%S")
    assert r["testbed"]["slo"] == {"ttft_ms": 8.0, "tpot_ms": None, "e2e_ms": 40.0}
    # the per-request lists, as vLLM's --save-detailed: seconds, failed requests as vLLM writes them
    ok_ = (req["state"] == "FINISHED").to_numpy()
    assert len(r["ttfts"]) == len(r["itls"]) == len(r["errors"]) == 50
    assert np.allclose(np.array(r["ttfts"])[ok_], req.loc[ok_, "ttft_s"])
    assert np.allclose(np.array(r["latencies"])[ok_], req.loc[ok_, "e2e_s"])
    assert sum(r["output_lens"]) == r["total_output_tokens"] and r["input_lens"] == list(req["prompt_tokens"])
    assert [len(g) for g in r["itls"]] == [n - 1 if good else 0 for n, good in zip(req["output_tokens"], ok_)]
    assert [bool(e) for e in r["errors"]] == list(~ok_) and all(e.startswith("rejected: ") for e in r["errors"] if e)
    # peaks, by brute force: requests in flight at each arrival; tokens in each second from the first arrival
    start, end = done["arrival_s"].to_numpy(), done["finish_s"].to_numpy()
    assert r["max_concurrent_requests"] == max(((start <= t) & (t < end)).sum() for t in start)
    t0 = req["arrival_s"].min()
    per_second = pd.Series(np.floor(np.concatenate(list(done["token_times_s"])) - t0)).value_counts()
    assert r["max_output_tokens_per_s"] == per_second.max()


def test_aiperf_records_agree_with_the_run(run_dir, tmp_path):
    out = tmp_path / "profile_export.jsonl"
    p = ok(export(run_dir, "--format", "aiperf", "--out", out))
    assert p.stdout.strip() == f"wrote {out} (50 records)"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    req = pd.read_parquet(run_dir / "requests.parquet").sort_values("rid")
    started = datetime.datetime.fromisoformat(json.loads((run_dir / "summary.json").read_text())["started_at"])
    base_ns = round(started.timestamp() * 1e6) * 1000
    assert len(records) == len(req)
    for i, (rec, row) in enumerate(zip(records, req.itertuples())):
        meta = rec["metadata"]
        assert set(meta) == AIPERF_METADATA and meta["session_num"] == i and meta["x_request_id"] == str(row.rid)
        assert meta["benchmark_phase"] == "profiling" and meta["worker_id"] == "testbed-sim"
        assert abs(meta["request_start_ns"] - (base_ns + row.arrival_s * 1e9)) < 1e3
        assert meta["request_end_ns"] >= meta["request_start_ns"]
        mt = rec["metrics"]
        if row.state != "FINISHED":
            assert rec["error"]["type"] == "RequestRejected" and rec["error"]["message"] == row.reject_reason
            assert mt == {"error_isl": {"value": row.prompt_tokens, "unit": "tokens"}}
            continue
        assert rec["error"] is None
        assert abs(meta["request_end_ns"] - (base_ns + row.finish_s * 1e9)) < 1e3
        assert mt["time_to_first_token"] == {"value": pytest.approx(row.ttft_s * 1000), "unit": "ms"}
        assert mt["request_latency"]["value"] == pytest.approx(row.e2e_s * 1000)
        assert mt["input_sequence_length"]["value"] == row.prompt_tokens
        assert mt["output_sequence_length"]["value"] == mt["output_token_count"]["value"] == row.output_tokens
        if row.output_tokens > 1:
            itl = mt["inter_token_latency"]["value"]
            assert itl == pytest.approx(row.tpot_s * 1000)  # AIPerf's ITL is (latency - TTFT) / (OSL - 1)
            assert itl == pytest.approx((mt["request_latency"]["value"] - mt["time_to_first_token"]["value"])
                                        / (row.output_tokens - 1))
            assert len(mt["inter_chunk_latency"]["value"]) == row.output_tokens - 1
            assert mt["output_token_throughput_per_user"]["value"] == pytest.approx(1000 / itl)
        else:
            assert "inter_token_latency" not in mt


def test_an_engine_run_exports_its_own_figures(tmp_path):
    """A committed real-engine run (Qwen3-0.6B on an H200), written before summary.json had started_at."""
    out = tmp_path / "engine.json"
    p = ok(export(ENGINE_RUN, "--format", "vllm", "--out", out))
    assert "the run's start is unknown" in p.stderr  # said, not guessed
    r, m = json.loads(out.read_text()), json.loads((ENGINE_RUN / "summary.json").read_text())["metrics"]
    assert r["backend"] == "testbed-engine" and r["date"] == "19700101-000000"
    for key in ("completed", "request_throughput", "mean_ttft_ms", "p99_tpot_ms", "mean_itl_ms", "median_ttft_ms"):
        assert r[key] == pytest.approx(m[key]), key
    assert r["mean_e2el_ms"] == pytest.approx(m["mean_e2e_latency_ms"])  # the summary's name before vLLM's
    assert r["request_goodput"] is None  # no SLO given
    assert r["request_rate"] == pytest.approx(r["testbed"]["offered_rate"])  # measured: the run does not say
    lines = ok(export(ENGINE_RUN, "--format", "aiperf", "--out", "-")).stdout.splitlines()
    assert len(lines) == len(pd.read_parquet(ENGINE_RUN / "requests.parquet"))
    assert json.loads(lines[0])["metadata"]["worker_id"] == "testbed-engine"


def test_a_run_cut_short_exports_its_unfinished_requests_as_failed(tmp_path, monkeypatch):
    from testbed.config import compose
    from testbed.export.aiperf import aiperf_records
    from testbed.export.rundir import read_run
    from testbed.export.vllm_bench import vllm_result
    from testbed.run import run
    from testbed.sim.executor import SimExecutor
    real, calls = SimExecutor.launch, []

    def failing(self, plan):
        calls.append(1)
        if len(calls) == 200:
            raise RuntimeError("the device fell over")
        return real(self, plan)
    monkeypatch.setattr(SimExecutor, "launch", failing)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="run stopped early"):
        run(compose(["trace.num_requests=60", "progress=false"]), str(out), print_table=False)
    data = read_run(out)
    req = data.requests
    unfinished = int((~req["state"].isin(["FINISHED", "REJECTED", "ABORTED"])).sum())
    assert unfinished > 0
    r = vllm_result(data)
    assert r["failed"] == unfinished and r["completed"] == (req["state"] == "FINISHED").sum()
    assert r["testbed"]["complete"] is False
    records = list(aiperf_records(data))
    stopped = [x for x in records if x["error"]]
    assert len(stopped) == unfinished and {x["error"]["type"] for x in stopped} == {"RunStopped"}
    assert "the device fell over" in stopped[0]["error"]["message"]
    p = ok(export(out, "--format", "aiperf"))
    assert "is a run cut short" in p.stderr


@pytest.mark.parametrize("case", ["missing", "file", "empty", "sweep", "no_requests", "bad_summary", "bad_parquet",
                                  "format", "no_format", "percentiles", "out_dir_missing"])
def test_bad_input_is_one_line(case, run_dir, tmp_path):
    import shutil
    d = tmp_path / "d"
    args, needle = [d, "--format", "vllm"], None
    if case == "missing":
        needle = f"{d}: no such directory"
    elif case == "file":
        d.write_text("x")
        needle = "not a directory"
    elif case == "empty":
        d.mkdir()
        needle = "not a run directory (no summary.json, no requests.parquet)"
    elif case == "sweep":
        shutil.copytree(run_dir, d / "0_policy=chunked")
        needle = "holds 1 run directories (a sweep); export one of them"
    elif case == "no_requests":
        shutil.copytree(run_dir, d)
        (d / "requests.parquet").unlink()
        needle = "no requests.parquet"
    elif case == "bad_summary":
        shutil.copytree(run_dir, d)
        (d / "summary.json").write_text("{not json")
        needle = "summary.json: unreadable (JSONDecodeError"
    elif case == "bad_parquet":
        shutil.copytree(run_dir, d)
        (d / "requests.parquet").write_bytes(b"PAR1 truncated")
        needle = "requests.parquet: unreadable"
    elif case == "format":
        args = [run_dir, "--format", "genai-perf"]
        needle = "invalid choice: 'genai-perf' (choose from 'aiperf', 'vllm')"
    elif case == "no_format":
        args, needle = [run_dir], "the following arguments are required: --format"
    elif case == "percentiles":
        args, needle = [run_dir, "--format", "vllm", "--percentiles", "99,150"], "--percentiles '99,150': 150"
    elif case == "out_dir_missing":
        args, needle = [run_dir, "--format", "aiperf", "--out", tmp_path / "no" / "x.jsonl"], "could not write"
    p = export(*args)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr
