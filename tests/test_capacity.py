"""`python -m testbed.capacity`: the bisection's bracket (a property test over any attainment
curve, monotone or not), end-to-end searches checked against their runs' own files, both ends
of the range, and bad input as one line."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from testbed.capacity.search import AT_HIGH, BELOW_LOW, FOUND, bisect

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def capacity(*args, env_path: str | None = None):
    env = {**os.environ, "PYTHONPATH": env_path or str(REPO)}
    return subprocess.run([sys.executable, "-m", "testbed.capacity", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def ok(p):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@settings(max_examples=300, deadline=None)
@given(st.floats(0.01, 10), st.floats(1.5, 1000), st.integers(0, 12), st.floats(0.05, 1),
       st.floats(0.005, 500), st.floats(0, 0.3), st.integers(0, 2**31))
def test_the_answer_is_bracketed_by_what_was_measured(low, ratio, iterations, target, knee, noise, seed):
    """Attainment falls past a knee, plus per-rate noise (a finite trace): whatever the curve,
    the answer was measured meeting the target, the next rate tried above it missing, and no
    rate tried lies between them."""
    import random
    high = low * ratio
    measured: dict[float, float] = {}

    def measure(rate, role):
        assert rate not in measured and low <= rate <= high
        rng = random.Random(hash((seed, rate)))
        measured[rate] = min(1.0, max(0.0, (1.0 if rate <= knee else knee / rate) + rng.uniform(-noise, noise)))
        return measured[rate]
    a = bisect(measure, low, high, iterations, target)
    if a.status == BELOW_LOW:
        assert list(measured) == [low] and measured[low] < target and a.rate is None and a.above == low
        return
    assert measured[low] >= target
    if a.status == AT_HIGH:
        assert list(measured) == [low, high] and measured[high] >= target and a.rate == high and a.above is None
        return
    assert a.status == FOUND and len(measured) <= 2 + iterations
    assert measured[a.rate] >= target > measured[a.above] and a.rate < a.above
    assert not any(a.rate < r < a.above for r in measured)
    if noise == 0 and len(measured) == 2 + iterations:  # a monotone curve: the bracket holds the knee's crossing
        assert math.log(a.above / a.rate) <= math.log(ratio) / 2 ** iterations * 1.01 + 1e-3


@pytest.mark.slow  # 10 runs: 15-20 s on 2 cores
def test_a_search_over_two_policies(tmp_path):
    out = tmp_path / "cap"
    p = ok(capacity("trace.num_requests=40", "slo.ttft_ms=200", "slo.tpot_ms=30",
                    "capacity.policies=[prefill_first,chunked]", "capacity.iterations=3", "capacity.low=0.25",
                    "capacity.high=16", f"capacity.out={out}"))
    assert "search: trace.rate in [0.25, 16] req/s, bisection on log(rate), at most 3 steps" in p.stdout
    assert "90% of requests within TTFT <= 200 ms, TPOT <= 30 ms" in p.stdout
    table = pd.read_parquet(out / "capacity.parquet")
    assert (out / "capacity.csv").exists() and (out / "capacity.png").read_bytes()[:8] == PNG
    result = json.loads((out / "capacity.json").read_text())
    assert result["settings"]["iterations"] == 3 and result["settings"]["target"] == 0.9
    for policy in ("prefill_first", "chunked"):
        a = result["answers"][policy]
        assert a["status"] == "found", a
        rows = table[table["policy"] == policy].set_index("rate")
        assert len(rows) <= 5 and rows.loc[0.25, "role"] == "low" and rows.loc[16, "role"] == "high"
        assert rows.loc[a["rate"], "slo_attainment"] >= 0.9 > rows.loc[a["above"], "slo_attainment"]
        assert not any(a["rate"] < r < a["above"] for r in rows.index)
        assert f"{policy}: capacity {a['rate']:g} req/s" in p.stdout
        for rate, row in rows.iterrows():  # each row is its run: attainment recounted from requests.parquet
            run = Path(row["run_dir"])
            req = pd.read_parquet(run / "requests.parquet")
            s = json.loads((run / "summary.json").read_text())
            assert s["config"]["trace"]["rate"] == rate and s["config"]["policy"]["name"] == policy
            done = req[req["state"] == "FINISHED"]
            good = ((done["ttft_s"] * 1000 <= 200) & ~(done["tpot_s"] * 1000 > 30)).sum()
            assert row["slo_attainment"] == pytest.approx(good / len(req))
            assert row["meets"] == (row["slo_attainment"] >= 0.9)
            assert row["request_goodput"] == pytest.approx(s["metrics"]["request_goodput"])
    # the search's directory reads as a sweep over policy and rate
    rep = subprocess.run([sys.executable, "-m", "testbed.report", str(out), "--no-plots"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and f"{len(table)} jobs in" in rep.stdout
    assert pd.read_parquet(out / "sweep.parquet")["trace.rate"].nunique() == table["rate"].nunique()


def test_even_the_lowest_rate_misses(tmp_path):
    p = ok(capacity("trace.num_requests=20", "slo.ttft_ms=1", f"capacity.out={tmp_path / 'c'}"))
    assert "chunked: even the lowest rate, 0.25 req/s, misses" in p.stdout and "lower capacity.low" in p.stdout
    t = pd.read_parquet(tmp_path / "c" / "capacity.parquet")
    assert list(t["rate"]) == [0.25]  # nothing above is tried
    assert json.loads((tmp_path / "c" / "capacity.json").read_text())["answers"]["chunked"]["status"] == "below_low"


def test_the_highest_rate_still_meets_and_the_plot_is_optional(tmp_path):
    stub = tmp_path / "no_mpl" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named matplotlib', name='matplotlib')\n")
    out = tmp_path / "c"
    p = ok(capacity("trace.num_requests=20", "slo.e2e_ms=1e7", "capacity.high=2", f"capacity.out={out}",
                    env_path=f"{stub.parent}{os.pathsep}{REPO}"))
    assert "chunked: the highest rate, 2 req/s, still meets: 100.0% attained; capacity >= 2 req/s" in p.stdout
    assert list(pd.read_parquet(out / "capacity.parquet")["rate"]) == [0.25, 2.0]
    assert p.stderr.strip().splitlines() == ["note: capacity.png needs matplotlib (pip install 'testbed[analysis]'); "
                                             "the table is written"]
    assert not (out / "capacity.png").exists()
    again = capacity("trace.num_requests=20", "slo.e2e_ms=1e7", f"capacity.out={out}")
    assert again.returncode == 2 and again.stderr.strip() == \
        f"error: {out} is not empty; give this search its own capacity.out="


@pytest.mark.parametrize("args, needle", [
    ([], "testbed.capacity needs an SLO to attain: slo.ttft_ms=, slo.tpot_ms= and/or slo.e2e_ms="),
    (["slo.ttft_ms=0"], "slo.ttft_ms=0.0 is invalid; allowed: null (no SLO) or a number of milliseconds > 0"),
    (["slo.e2e_ms=-2"], "slo.e2e_ms=-2.0 is invalid"),
    (["slo.ttft_ms=100", "trace.rate=4"], "trace.rate is what testbed.capacity searches"),
    (["slo.ttft_ms=100", "backend=engine"], "backend=engine: testbed.capacity searches in the simulator"),
    (["slo.ttft_ms=100", "trace=azure_conv"], "trace=azure_conv has its own arrival times"),
    (["slo.ttft_ms=100", "capacity.target=1.5"], "capacity.target=1.5 is invalid; allowed: a share in (0, 1]"),
    (["slo.ttft_ms=100", "capacity.low=0"], "capacity.low=0.0 is invalid; allowed: a rate in req/s > 0"),
    (["slo.ttft_ms=100", "capacity.low=8", "capacity.high=4"], "capacity.low=8 is not below capacity.high=4"),
    (["slo.ttft_ms=100", "capacity.iterations=-1"], "capacity.iterations=-1 is invalid"),
    (["slo.ttft_ms=100", "capacity.iterations=2.5"], "capacity.iterations=2.5 is invalid"),
    (["slo.ttft_ms=100", "capacity.policies=[chunked,foo]"], "policy='foo' is unknown; allowed: chunked,"),
    (["slo.ttft_ms=100", "capacity.policies=[chunked,chunked]"], "capacity.policies names chunked twice"),
    (["slo.ttft_ms=100", "capacity.policies=chunked"], "capacity.policies='chunked' is invalid; allowed: a list"),
    (["slo.ttft_ms=100", "capacity.nope=1"], "capacity.nope is not a setting; the settings: capacity.high,"),
    (["slo.ttft_ms=100", "policy=chunked", "capacity.policies=[chunked]"], "not both"),
    (["slo.ttft_ms=100", "trace.nonexistent=1"], "trace.nonexistent is not a setting of trace"),
    (["slo.ttft_ms=100", "-m"], "-m: testbed.capacity takes overrides only"),
])
def test_bad_input_is_one_line(tmp_path, args, needle):
    p = capacity(*args, f"capacity.out={tmp_path / 'c'}")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr
    assert not (tmp_path / "c").exists()  # nothing was run
