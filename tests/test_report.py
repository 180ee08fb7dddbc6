"""`python -m testbed.report DIR` end to end on a real (small) sweep and a single run."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def report(*args):
    return subprocess.run([sys.executable, "-m", "testbed.report", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    from analysis import run_sweep
    d = tmp_path_factory.mktemp("report") / "sw"
    run_sweep({"policy": ["decode_first", "chunked"], "trace.rate": [4, 16]}, fixed=["trace.num_requests=100"],
              sweep_dir=d)
    broken = d / "4_policy=chunked,trace.rate=32"  # a job that died: Hydra's files only
    (broken / ".hydra").mkdir(parents=True)
    (broken / ".hydra" / "overrides.yaml").write_text("- policy=chunked\n- trace.rate=32\n")
    (d / "sweep.parquet").unlink()  # written again by the report
    return d


def test_report_on_a_sweep(sweep):
    p = report(sweep, "--slo-ttft-ms", 500, "--slo-tpot-ms", 30)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "4 jobs in" in out and "(1 skipped)" in out
    assert "skipped 4_policy=chunked,trace.rate=32: no summary.json" in out
    header = next(line for line in out.splitlines() if "TTFT p99" in line)
    for col in ("rate", "policy", "req/s", "TTFT p50", "TPOT p99", "goodput", "SLO"):
        assert col in header
    assert out.count("decode_first") == 2 and out.count("chunked") >= 2
    for f in ("latency_cdf.png", "load.png", "gantt.png", "kv.png"):
        assert (sweep / f).read_bytes()[:8] == PNG, f
    t = pd.read_parquet(sweep / "sweep.parquet")
    assert len(t) == 4 and {"policy", "trace.rate", "goodput", "slo_attainment", "p99_ttft_ms"} <= set(t.columns)
    assert (t["goodput"] <= t["request_throughput"] + 1e-9).all()
    assert (sweep / "sweep.csv").exists()


def test_report_on_one_run(sweep, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(next(p for p in sorted(sweep.iterdir()) if (p / "summary.json").exists()), run)
    p = report(run, "--job", run.name)
    assert p.returncode == 0, p.stderr
    assert "1 job in" in p.stdout and "decode_first" in p.stdout
    assert (run / "gantt.png").exists() and (run / "kv.png").exists() and not (run / "load.png").exists()
    assert len(pd.read_parquet(run / "sweep.parquet")) == 1


def test_a_run_that_ran_no_steps_is_reported_without_its_kv_plot(tmp_path):
    """Every request rejected (longer than the model's context): the table and the other plots,
    and a line saying why kv.png is not drawn."""
    trace = tmp_path / "long.csv"
    trace.write_text("prompt_tokens,output_tokens\n200000,5\n300000,6\n")
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "testbed.run", "trace=file", f"trace.path={trace}", "progress=false",
                        f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    p = report(run)
    assert p.returncode == 0, p.stderr
    assert f"kv.png not drawn: job {run.name} ran no steps" in p.stdout
    assert "Warning" not in p.stderr, p.stderr
    assert (run / "latency_cdf.png").read_bytes()[:8] == PNG and (run / "gantt.png").exists()
    assert not (run / "kv.png").exists()


def test_an_e2e_slo_recomputes_goodput_and_a_bad_slo_is_one_line(sweep, tmp_path):
    one = tmp_path / "one"
    shutil.copytree(next(p for p in sorted(sweep.iterdir()) if (p / "summary.json").exists()), one)
    req = pd.read_parquet(one / "requests.parquet")
    limit = float(req["e2e_s"].median() * 1000)  # about half the requests meet it
    p = report(one, "--slo-e2e-ms", limit, "--no-plots")
    assert p.returncode == 0, p.stderr
    t = pd.read_parquet(one / "sweep.parquet")
    good = int((req["e2e_s"] * 1000 <= limit).sum())
    assert t["slo_attainment"].iloc[0] == pytest.approx(good / len(req))
    assert t["request_goodput"].iloc[0] == t["goodput"].iloc[0] < t["request_throughput"].iloc[0]
    for flag, value in (("--slo-e2e-ms", "0"), ("--slo-ttft-ms", "-5")):
        p = report(one, flag, value, "--no-plots")
        assert p.returncode == 2 and p.stderr.strip() == \
            f"error: {flag} {float(value):g} is invalid; an SLO is a number of milliseconds > 0"


@pytest.mark.parametrize("case", ["missing", "empty", "only_broken", "file", "bad_job_option", "bad_x", "bad_by"])
def test_bad_dir_is_one_line_error(case, sweep, tmp_path):
    args = []
    if case == "missing":
        target = tmp_path / "does-not-exist"
    elif case == "empty":
        target = tmp_path
    elif case == "only_broken":
        target = tmp_path / "sw"
        (target / "0_x" / ".hydra").mkdir(parents=True)
        (target / "0_x" / ".hydra" / "overrides.yaml").write_text("- policy=chunked\n")
        (target / "1_y").mkdir()
        (target / "1_y" / "summary.json").write_text("{not json")
    elif case == "file":
        target = tmp_path / "f.txt"
        target.write_text("x")
    elif case == "bad_job_option":
        target, args = sweep, ["--job", "nope"]
    else:  # a column that is not there, even where no load.png would be drawn
        target, args = sweep, ["--x" if case == "bad_x" else "--by", "nope"]
    p = report(target, *args)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert p.stderr.startswith("error: ")


def test_a_reader_that_goes_away_ends_nothing(sweep, tmp_path):
    """`python -m testbed.report DIR | head -1`: no traceback, exit 0, the files written anyway."""
    run = tmp_path / "run"
    shutil.copytree(next(p for p in sorted(sweep.iterdir()) if (p / "summary.json").exists()), run)
    p = subprocess.Popen([sys.executable, "-m", "testbed.report", str(run), "--no-plots"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read()
    assert p.wait(180) == 0 and "Traceback" not in err, err
    assert (run / "sweep.parquet").exists()


def test_plots_without_matplotlib_are_one_line_and_the_table_is_written(sweep, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(next(p for p in sorted(sweep.iterdir()) if (p / "summary.json").exists()), run)
    stub = tmp_path / "no_mpl" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named matplotlib', name='matplotlib')\n")
    import os
    env = {**os.environ, "PYTHONPATH": f"{stub.parent}{os.pathsep}{REPO}"}
    p = subprocess.run([sys.executable, "-m", "testbed.report", str(run)], cwd=REPO, capture_output=True, text=True,
                       timeout=180, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "matplotlib" in last and "--no-plots" in last and "sweep.parquet" in last
    assert (run / "sweep.parquet").exists()
    assert report(run, "--no-plots").returncode == 0
