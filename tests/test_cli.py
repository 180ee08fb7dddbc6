"""End-to-end runs of `python -m testbed.run` (simulator), as a user would type them."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from serve_fixtures import default_sigint

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None, timeout=300, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "testbed.run", *args, "progress=false"], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def ok(p):
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


def test_default_run_writes_three_files(tmp_path):
    out = tmp_path / "run"
    ok(cli("policy=chunked", "trace=sharegpt", "trace.num_requests=300", f"hydra.run.dir={out}"))
    req = pd.read_parquet(out / "requests.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert len(req) == 300 and set(req["state"]) == {"FINISHED"}
    assert (req["output_tokens"] == req["max_new_tokens"]).all()
    assert len(steps) > 300 and steps["duration_s"].gt(0).all()
    m = summary["metrics"]
    assert summary["complete"] is True and m["completed"] == 300
    for key in ("mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "p90_e2e_latency_ms", "request_throughput",
                "output_throughput", "total_token_throughput"):
        assert m[key] is not None and m[key] > 0, key
    assert summary["kv"]["integrity"]["in_use"] == 0
    assert summary["config"]["policy"]["name"] == "chunked"
    # TPOT as defined: (e2e - ttft) / (output - 1)
    r = req[req["output_tokens"] > 1].iloc[0]
    assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1))
    assert len(r["token_times_s"]) == r["output_tokens"]
    log = (out / "run.log").read_text()  # the end-of-run table is in the run's log too
    assert "TTFT ms" in log and "written" in log


def test_same_config_same_bytes(tmp_path):
    """Two processes (with different hash seeds: no dict or set order may leak into the
    results) write byte-identical Parquet files and the same metrics."""
    for d, seed in (("a", "1"), ("b", "2")):
        ok(cli("trace=mooncake_synthetic", "trace.num_requests=150", "policy.order=lpm",
               f"hydra.run.dir={tmp_path / d}", env={"PYTHONHASHSEED": seed}))
    for f in ("requests.parquet", "steps.parquet"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    metrics = [json.loads((tmp_path / d / "summary.json").read_text())["metrics"] for d in ("a", "b")]
    assert metrics[0] == metrics[1]


def _sweep_dirs(root: Path):
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "summary.json").exists())


@pytest.mark.slow  # a multirun of every option of a group
@pytest.mark.parametrize("group,names", [
    ("trace", "sharegpt,azure_conv,azure_code,arxiv,bwb,mooncake_conversation,mooncake_synthetic,synthetic"),
    ("policy", "prefill_first,decode_first,chunked"),
    ("eviction", "lru,lfu,fifo,slru,priority"),
    ("cache", "radix,none"),
    ("policy.order", "fcfs,sjf,lpm,priority"),
])
def test_every_option_runs(tmp_path, group, names):
    # a small KV pool and a burst, so that eviction and preemption really happen (asserted below;
    # which prefix each eviction order keeps: test_scheduler.py::test_eviction_order_decides_...)
    small = group in ("eviction", "cache", "policy.order")
    extra = ["trace=sharegpt", "engine.num_pages=3000", "policy.reserve=estimate", "trace.rate=200"] if small else []
    ok(cli("-m", f"{group}={names}", "trace.num_requests=60", *extra, f"hydra.sweep.dir={tmp_path}"))
    jobs = _sweep_dirs(tmp_path)
    assert len(jobs) == len(names.split(","))
    for job in jobs:
        s = json.loads((job / "summary.json").read_text())
        req = pd.read_parquet(job / "requests.parquet")
        assert s["complete"] and len(req) == 60, job.name
        assert set(req["state"]) <= {"FINISHED", "REJECTED"}, job.name
        assert req.loc[req["state"] == "REJECTED", "reject_reason"].notna().all()
        if small:
            steps = pd.read_parquet(job / "steps.parquet")
            assert steps["preempted"].sum() > 0, job.name
            assert (steps["evicted_pages"].sum() > 0) == ("cache=none" not in job.name), job.name
    sweep = pd.read_parquet(tmp_path / "sweep.parquet")
    assert len(sweep) == len(jobs)


def test_file_trace_and_over_context(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [100, 200, 140000], "output_tokens": [10, 20, 5],
                  "arrival_s": [0.0, 0.1, 0.2]}).to_csv(path, index=False)
    out = tmp_path / "run"
    ok(cli("trace=file", f"trace.path={path}", f"hydra.run.dir={out}"))
    req = pd.read_parquet(out / "requests.parquet")
    assert list(req["state"]) == ["FINISHED", "FINISHED", "REJECTED"]
    assert "exceeds the model context" in req["reject_reason"].iloc[2]
    s = json.loads((out / "summary.json").read_text())
    assert s["trace"]["over_context"]["count"] == 1
    out2 = tmp_path / "run2"
    ok(cli("trace=file", f"trace.path={path}", "trace.over_context=truncate", f"hydra.run.dir={out2}"))
    req = pd.read_parquet(out2 / "requests.parquet")
    assert set(req["state"]) == {"FINISHED"} and req["prompt_tokens"].iloc[2] + 5 <= 131072


def test_trace_max_context_narrows_the_runs_context(tmp_path):
    """A deployment with a shorter context (vLLM's --max-model-len): the trace, the scheduler
    and the engine hold to trace.max_context (it was overwritten with the model's: no effect)."""
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [100, 300, 1000], "output_tokens": [10, 20, 30],
                  "arrival_s": [0.0, 0.1, 0.2]}).to_csv(path, index=False)
    ok(cli("trace=file", f"trace.path={path}", "trace.max_context=400", f"hydra.run.dir={tmp_path / 'a'}"))
    req = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert list(req["state"]) == ["FINISHED", "FINISHED", "REJECTED"]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["trace"]["over_context"]["max_context"] == 400
    ok(cli("trace=file", f"trace.path={path}", "trace.max_context=400", "trace.over_context=truncate",
           f"hydra.run.dir={tmp_path / 'b'}"))
    req = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    assert set(req["state"]) == {"FINISHED"} and list(req["prompt_tokens"]) == [100, 300, 370]
    p = cli("trace.max_context=200000", f"hydra.run.dir={tmp_path / 'c'}")
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        "error: trace.max_context=200000 is invalid; allowed: 2..131072 (the context of llama3_8b), or null for the model's")


def test_a_users_file_is_used_whole_and_the_table_says_what_was_left_out(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [50 + i % 200 for i in range(1500)],
                  "output_tokens": [4] * 1500}).to_csv(path, index=False)
    p = ok(cli("trace=file", f"trace.path={path}", "trace.rate=200", f"hydra.run.dir={tmp_path / 'all'}"))
    assert len(pd.read_parquet(tmp_path / "all" / "requests.parquet")) == 1500
    trace_line = next(line for line in p.stdout.splitlines() if line.startswith("trace"))
    assert "1,500 requests" in trace_line and "left out" not in trace_line
    p = ok(cli("trace=file", f"trace.path={path}", "trace.rate=200", "trace.num_requests=1000",
               f"hydra.run.dir={tmp_path / 'part'}"))
    assert "1,000 requests of 1,500 rows (500 left out by trace.num_requests)" in p.stdout
    s = json.loads((tmp_path / "part" / "summary.json").read_text())["trace"]
    assert (s["num_requests"], s["rows"], s["rows_left_out"]) == (1000, 1500, 500)


@pytest.mark.parametrize("args,needle", [
    (["trace=file", "trace.path=/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    (["policy.order=random"], "policy.order"),
    (["trace.rate=-1"], "rate"),
    (["engine.page_size=0"], "engine.page_size"),
    (["engine.cuda_graph_max_bs=-1"], "engine.cuda_graph_max_bs=-1 is invalid; allowed: 0 (no decode graphs) or"),
    (["engine.cpu_threads=0"], "engine.cpu_threads=0 is invalid; allowed: null (the cores over the TP ranks) or"),
    (["hardware.name=foo"], "hardware.name='foo' is invalid; allowed: one of a100, h100, h200"),
    # weights + half a KV page of llama3_8b on an H200: less than one page left
    (["engine.mem_fraction=0.11390487965957447"], "less than one page"),
    (["engine.kernels=fused"], "engine.kernels='fused' is unknown; allowed: auto, torch, triton"),
    (["model=llama3_70b"], "does not fit h200 (141 GB x mem_fraction 0.9); engine.tp=2 would fit it"),
    # what Hydra itself cannot compose: one line too
    (["policy=foo"], "policy='foo' is unknown; allowed: chunked, decode_first, prefill_first"),
    # a file where the trace's name goes (Hydra reads the slashes as config groups)
    (["trace=/tmp/my_trace.csv"], "trace='/tmp/my_trace.csv' is unknown; allowed: arxiv, azure_code, "
     "azure_conv, bwb, file, mooncake_conversation, mooncake_synthetic, sharegpt, synthetic; a file of yours: "
     "trace=file trace.path=/tmp/my_trace.csv"),
    (["trace=mine.jsonl"], "; a file of yours: trace=file trace.path=mine.jsonl"),
    (["trace.nonexistent_key=3"], "trace.nonexistent_key is not a setting of trace; its settings: name, path,"),
    (["engine.tp=abc"], "engine.tp=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["trace.rate=[1"], "trace.rate=[1: not an override Hydra can parse"),
    (["+trace.x=3"], "trace.x is not a setting of trace; its settings: name, path,"),  # was dropped unsaid
    (["+foo=3"], "foo is not a setting; the settings: backend, policy,"),
    (["-m", "trace.rate=1,2", "eviction=arc"], "eviction='arc' is unknown; allowed: fifo, lfu, lru"),
    (["engine.prefill_backend=fa4"], "engine.prefill_backend"),
    (["engine.whole_step_graphs=true", "engine.page_size=16"], "engine.whole_step_graphs=true needs "
     "engine.piecewise_graphs=true, engine.page_size=1 and engine.attention=flashinfer (got True, 16,"),
    (["model.config_path=/nope/config.json"], "/nope/config.json"),
    (["slo.ttft_ms=-5"], "slo.ttft_ms=-5.0 is invalid; allowed: null (no SLO) or a number of milliseconds > 0"),
    (["slo.tpot_ms=0"], "slo.tpot_ms=0.0 is invalid"),
    (["slo.e2e_ms=-1"], "slo.e2e_ms=-1.0 is invalid; allowed: null (no SLO) or a number of milliseconds > 0"),
    (["policy.name=foo"], "policy.name='foo' is unknown; allowed: chunked, decode_first, prefill_first"),
    (["eviction.name=arc"], "eviction.name='arc' is unknown; allowed: fifo, lfu, lru, priority, slru"),
    (["engine.attention=nope"], "engine.attention='nope' is unknown; allowed: flashinfer, torch"),
    (["costmodel.name=nope"], "costmodel.name='nope' is unknown; allowed: auto, calibrated, roofline"),
    # limits are the deployment's, budgets the policy's own: an old script's override says where it went
    (["policy.max_running=8"], "policy.max_running is now scheduler.max_running"),
    (["-m", "policy.max_running=4,8"], "policy.max_running is now scheduler.max_running"),
    (["policy=prefill_first", "policy.token_budget=64"], "policy.token_budget is not a setting of "
     "policy=prefill_first; its settings: name, order, reserve, chunk_size, estimate_init, estimate_min, "
     "estimate_decay, max_prefill_tokens (token_budget is a knob of policy=chunked)"),
    (["policy.max_prefill_tokens=16384"], "(max_prefill_tokens is a knob of policy=decode_first and "
     "policy=prefill_first); the most tokens a step may hold is scheduler.max_step_tokens"),
    (["policy.token_budget=10000"], "policy.token_budget=10000 is more than a step may hold "
     "(scheduler.max_step_tokens=8192); raise scheduler.max_step_tokens"),
    (["scheduler.max_step_tokens=128"], "scheduler.max_step_tokens=128 is invalid; allowed: at least "
     "scheduler.max_running=256"),
    (["scheduler.max_running=0"], "scheduler.max_running=0 is invalid; allowed: an integer >= 1"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, needle):
    p = cli(*args, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert needle in p.stderr.strip().splitlines()[-1]


def test_the_limits_are_the_schedulers_in_every_entry_point(tmp_path):
    """scheduler.max_running caps the running requests in a run; the tools composing a config
    (testbed.profile, testbed.fidelity) say where an old name went in the same line."""
    from testbed.config import ConfigError, compose
    out = tmp_path / "run"
    ok(cli("scheduler.max_running=4", "policy=decode_first", "trace.num_requests=40", f"hydra.run.dir={out}"))
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["scheduler"] == {"max_running": 4, "max_step_tokens": 8192}
    assert "max_running" not in s["config"]["policy"] and s["config"]["policy"]["max_prefill_tokens"] == 8192
    running = pd.read_parquet(out / "steps.parquet")["running"]
    assert running.max() == 4 and s["metrics"]["completed"] == 40
    with pytest.raises(ConfigError, match="^policy.max_running is now scheduler.max_running"):
        compose(["policy.max_running=8"])


@pytest.mark.parametrize("rows,needle", [
    ("prompt_tokens,output_tokens\n100,10\nabc,5\n", "row 2"),
    ("prompt_tokens,output_tokens\n100,10\n0,5\n", "prompt_tokens"),
    ("prompt_tokens,output_tokens\n100,-3\n", "output_tokens"),
])
def test_malformed_rows_named(tmp_path, rows, needle):
    path = tmp_path / "bad.csv"
    path.write_text(rows)
    p = cli("trace=file", f"trace.path={path}", f"hydra.run.dir={tmp_path / 'out'}")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert str(path) in last and needle in last


def test_unknown_policy_lists_known_ones(tmp_path):
    p = cli("policy=nosuch", f"hydra.run.dir={tmp_path}")
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "prefill_first" in p.stderr and "chunked" in p.stderr


# the README's example policy (its code block, as printed there), and an eviction order, each
# one new file and nothing else
NEW_POLICY = next(b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
                  if "(Policy)" in b)
NEW_EVICTION = "def key(node):\n    return (-node.last_access,)  # most recently used first\n"


def test_a_new_policy_or_eviction_module_is_a_config_option(tmp_path):
    """`policy=<module>` and `eviction=<module>` for a module just added, with no yaml file."""
    name = f"tmp_test_{os.getpid()}"
    made = {ROOT / "policies" / "scheduling" / f"{name}.py": NEW_POLICY,
            ROOT / "policies" / "eviction" / f"{name}.py": NEW_EVICTION}
    try:
        for path, text in made.items():
            path.write_text(text)
        out = tmp_path / "run"
        ok(cli(f"policy={name}", f"eviction={name}", "policy.step_tokens=2048", "trace=mooncake_synthetic",
               "trace.num_requests=60", "engine.num_pages=150000", f"hydra.run.dir={out}"))
        s = json.loads((out / "summary.json").read_text())
        assert s["complete"] and s["metrics"]["completed"] == 60
        assert s["config"]["policy"]["name"] == name and s["config"]["eviction"]["name"] == name
        assert s["config"]["policy"]["step_tokens"] == 2048  # the policy's own Config: a knob with no yaml
        assert pd.read_parquet(out / "steps.parquet")[["prefill_tokens", "decode_tokens"]].sum(axis=1).max() <= 2048
        assert pd.read_parquet(out / "steps.parquet")["evicted_pages"].sum() > 0
    finally:
        for path in made:
            path.unlink(missing_ok=True)
            for cached in (path.parent / "__pycache__").glob(f"{name}.*.pyc"):
                cached.unlink()


def _stop_mid_run(out, sig):
    """A long simulation, sent `sig` once its progress bar shows finished requests (a condition,
    not a sleep: loading 30k requests takes longer on a loaded machine)."""
    import threading
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "testbed.run", "progress=true", "trace=sharegpt",
                             "trace.num_requests=30000", "trace.rate=20", f"hydra.run.dir={out}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    err, seen = [], threading.Event()

    def read():
        buf = ""
        while ch := proc.stderr.read(1):
            buf += ch
            if re.search(r"\b[1-9]\d*/30000\b", buf[-200:]):
                seen.set()
        err.append(buf)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert seen.wait(300), "the run showed no finished request"
    proc.send_signal(sig)
    proc.stdout.read()
    proc.wait(timeout=120)
    t.join(30)
    return proc.returncode, "".join(err)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_keeps_finished_requests(tmp_path, sig, code, word):
    out = tmp_path / "run"
    rc, stderr = _stop_mid_run(out, sig)
    assert rc == code, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith(word)
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] is False and word in s["error"]
    req = pd.read_parquet(out / "requests.parquet")
    assert 0 < s["metrics"]["completed"] < 30000
    assert (req["state"] == "FINISHED").sum() == s["metrics"]["completed"]
    assert len(pd.read_parquet(out / "steps.parquet")) > 0


def test_a_failed_integrity_check_is_reported_after_the_results_are_written(tmp_path, monkeypatch):
    from testbed.config import compose
    from testbed.run import IntegrityError, run
    from testbed.scheduler.scheduler import Scheduler
    real = Scheduler.check_integrity

    def leaky(self):
        return {**real(self), "in_use": 3}
    monkeypatch.setattr(Scheduler, "check_integrity", leaky)
    out = tmp_path / "run"
    with pytest.raises(IntegrityError, match="KV leak"):
        run(compose(["trace=sharegpt", "trace.num_requests=20", "progress=false"]), str(out), print_table=False)
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] is False and "integrity check failed" in s["error"] and s["kv"]["integrity"]["in_use"] == 3
    assert s["metrics"]["completed"] == 20 and len(pd.read_parquet(out / "requests.parquet")) == 20


@pytest.mark.parametrize("where", ["check_integrity", "close"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_loop_waits_for_the_files(tmp_path, monkeypatch, where, sig):
    """A Ctrl-C or SIGTERM landing after the run's loop, before its files (a user pressing Ctrl-C
    twice): while the driver shuts down (the engine's TP ranks stopping) or in the end-of-run KV
    check, is held until the files are written, then stops the run as the signal asks."""
    import os

    import testbed.run as run_mod
    from testbed.config import compose
    from testbed.scheduler.scheduler import Scheduler
    from testbed.sim.driver import SimDriver
    owner = {"check_integrity": Scheduler, "close": SimDriver}[where]
    real = getattr(owner, where)

    def signalled(self):
        os.kill(os.getpid(), sig)
        return real(self)
    monkeypatch.setattr(owner, where, signalled)
    before = signal.getsignal(signal.SIGINT)  # Python's handler, or SIG_IGN under a job that ignores SIGINT
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt if sig == signal.SIGINT else run_mod.Terminated):
        run_mod.run(compose(["trace=sharegpt", "trace.num_requests=20", "progress=false"]), str(out),
                    print_table=False)
    s = json.loads((out / "summary.json").read_text())
    assert s["metrics"]["completed"] == 20 and len(pd.read_parquet(out / "requests.parquet")) == 20
    assert signal.getsignal(signal.SIGINT) is before  # the hold is let go


def test_a_run_directory_holds_one_run(tmp_path):
    from testbed.timeline.rundir import claim_run_dir
    out = tmp_path / "run"
    ok(cli("trace=sharegpt", "trace.num_requests=20", "progress=false", f"hydra.run.dir={out}"))
    before = {f: (out / f).read_bytes() for f in ("summary.json", ".hydra/overrides.yaml", ".hydra/config.yaml",
                                                   "run.log")}
    p = cli("trace=sharegpt", "trace.num_requests=30", "progress=false", f"hydra.run.dir={out}")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "already holds a run" in p.stderr.strip().splitlines()[-1]
    # the first run's files untouched, its record of its config too (Hydra rewrote .hydra/ before the refusal)
    assert {f: (out / f).read_bytes() for f in before} == before
    busy = tmp_path / "busy"
    lock = claim_run_dir(busy)  # another run holds it
    try:
        p = cli("trace=sharegpt", "trace.num_requests=20", "progress=false", f"hydra.run.dir={busy}")
        assert p.returncode == 2 and "in use by another run" in p.stderr.strip().splitlines()[-1]
        assert not (busy / "summary.json").exists()
    finally:
        lock.close()
    ok(cli("trace=sharegpt", "trace.num_requests=20", "progress=false", f"hydra.run.dir={busy}"))  # free again


def test_runs_started_together_get_their_own_directories(tmp_path):
    """The default run directory is named to the microsecond: a script's runs launched at once
    do not share one (the later ones were refused: the directory was in use)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "testbed.run", f"policy={p}", "trace.num_requests=20",
                               "progress=false"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for p in ("chunked", "prefill_first", "decode_first")]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    runs = sorted((tmp_path / "outputs").glob("*/*/summary.json"))
    assert sorted(json.loads(r.read_text())["config"]["policy"]["name"] for r in runs) == [
        "chunked", "decode_first", "prefill_first"]


def test_a_sweep_run_again_into_its_directory_keeps_its_jobs_labels(tmp_path):
    """Its jobs are refused, but Hydra has rewritten their .hydra/overrides.yaml by then: the
    combined table and analysis.load take each run's overrides from its summary.json."""
    ok(cli("-m", "policy=chunked,prefill_first", "trace.num_requests=20", f"hydra.sweep.dir={tmp_path}"))
    p = cli("-m", "policy=chunked,prefill_first", "trace.num_requests=30", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 1 and "already holds a run" in p.stderr and "hydra.sweep.dir" in p.stderr
    assert "failed job 0_policy=chunked: run directory" in p.stderr  # it exited 0: both jobs seemed done
    assert "failed job 1_policy=prefill_first: run directory" in p.stderr
    assert not (tmp_path / ".refused_jobs").exists()
    assert "trace.num_requests=30" in (tmp_path / "0_policy=chunked" / ".hydra" / "overrides.yaml").read_text()
    sweep = pd.read_parquet(tmp_path / "sweep.parquet")
    assert (sweep["trace.num_requests"] == 20).all() and (sweep["num_requests"] == 20).all()
    from analysis import load
    assert (load(tmp_path, steps=False, warn=False).requests["trace.num_requests"] == 20).all()


def test_a_failing_job_does_not_end_the_sweep(tmp_path):
    p = cli("-m", "trace.rate=-1,4,8", "trace=sharegpt", "trace.num_requests=20", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    jobs = {d.name: json.loads((d / "summary.json").read_text()) for d in _sweep_dirs(tmp_path)}
    assert len(jobs) == 3
    assert not [n for n in jobs if "progress" in n]  # job directories are named by what the sweep varies
    failed = [n for n, s in jobs.items() if not s["complete"]]
    assert len(failed) == 1 and "trace.rate=-1" in failed[0] and "rate=-1" in jobs[failed[0]]["error"]
    assert all(s["complete"] and s["metrics"]["completed"] == 20 for n, s in jobs.items() if n not in failed)
    sweep = pd.read_parquet(tmp_path / "sweep.parquet")
    assert len(sweep) == 3 and sweep.loc[sweep["complete"] == False, "job"].tolist() == failed  # noqa: E712
    assert f"failed job {failed[0]}" in p.stderr


@pytest.mark.parametrize("backend", ["sim", "engine"])
def test_a_tp_degree_that_does_not_split_the_model_is_one_line(tmp_path, backend):
    extra = ["engine.device=cpu", "engine.attention=torch", "model.weights=dummy"] if backend == "engine" else []
    p = cli(f"backend={backend}", "model=llama3_8b", "engine.tp=3", "trace.num_requests=5", *extra,
            f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "engine.tp=3" in last and "num_attention_heads 32" in last and "costmodel" not in last


@pytest.mark.parametrize("victim", ["steps.parquet", "summary.json"])
def test_a_full_disk_loses_only_the_file_it_could_not_write(tmp_path, monkeypatch, capsys, victim):
    import errno

    import pyarrow.parquet as pq_mod

    from testbed.config import compose
    from testbed.run import run
    from testbed.timeline.writer import WriteError
    real_write, real_text = pq_mod.write_table, Path.write_text

    def full(path):
        if Path(path).name.startswith(victim):
            raise OSError(errno.ENOSPC, "No space left on device")

    def write_table(table, where, **kw):
        full(where)
        return real_write(table, where, **kw)

    def write_text(self, *a, **kw):
        full(self)
        return real_text(self, *a, **kw)
    monkeypatch.setattr(pq_mod, "write_table", write_table)
    monkeypatch.setattr(Path, "write_text", write_text)
    out = tmp_path / "run"
    with pytest.raises(WriteError) as e:
        run(compose(["trace=sharegpt", "trace.num_requests=20", "progress=false"]), str(out))
    assert f"could not write {victim} (No space left on device)" in str(e.value) and "\n" not in str(e.value)
    printed = capsys.readouterr().out
    assert "TTFT ms" in printed and f"not written: {victim}" in printed  # the metrics printed anyway
    written = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert victim not in written and not any(n.endswith(".tmp") for n in written)
    assert len(pd.read_parquet(out / "requests.parquet")) == 20
    if victim != "summary.json":
        assert json.loads((out / "summary.json").read_text())["unwritten_files"] == [victim]


@pytest.mark.parametrize("overrides,want", [
    ([], True),  # the simulator models a GPU engine
    (["backend=engine", "engine.device=cuda"], True),
    (["backend=engine", "engine.device=cpu"], False),  # every op runs as it is enqueued: overlap only costs
    (["backend=engine", "engine.device=cpu", "engine.overlap=true"], True),
    (["engine.overlap=false"], False),
])
def test_overlap_defaults_per_device(overrides, want):
    from testbed.config import compose, resolved_overlap
    assert resolved_overlap(compose(overrides)) is want


def test_a_multirun_shows_no_progress_bars_unless_asked(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "testbed.run", "-m", "trace.rate=4,8", "trace=sharegpt",
                        "trace.num_requests=30", f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "req/s]" not in p.stderr and "it/s" not in p.stderr and "30/30" not in p.stderr
    assert sorted(d.name for d in _sweep_dirs(tmp_path)) == ["0_trace.rate=4", "1_trace.rate=8"]


def test_help_explains_every_knob():
    from testbed.config_help import knobs
    p = ok(subprocess.run([sys.executable, "-m", "testbed.run", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}))
    lines = p.stdout.splitlines()
    rows = knobs()
    assert len(rows) > 50
    for key, doc in rows:
        assert doc, f"{key} has no help line (a comment beside its field)"
        line = next((x for x in lines if x.split() and x.split()[0] == key), None)
        assert line is not None and doc in line, key
    assert any(x.split()[:2] == ["policy", "chunked,"] for x in lines if x.split())
    # defaults as a run composes them, not the dataclasses' placeholders
    assert any(x.split()[:2] == ["eviction.name", "lru"] for x in lines if x.split())

