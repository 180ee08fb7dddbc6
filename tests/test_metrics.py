"""summary.json's metrics (testbed.timeline.metrics): vLLM's names and definitions, and goodput
under any of the three SLOs, checked against a per-request count written out here."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from testbed.timeline.metrics import slo_met, stat_name, summarize


@st.composite
def runs(draw):
    """A requests.parquet frame: finished requests with token times, plus some that did not finish."""
    n = draw(st.integers(1, 25))
    rows = []
    for rid in range(n):
        arrival = draw(st.floats(0, 50))
        state = draw(st.sampled_from(["FINISHED"] * 4 + ["REJECTED", "ABORTED", "FAILED", "RUNNING"]))
        if state != "FINISHED":
            rows.append({"rid": rid, "state": state, "arrival_s": arrival, "finish_s": None, "prompt_tokens": 10,
                         "output_tokens": 0, "prefix_cached_tokens": 0, "preemptions": 0, "queue_s": None,
                         "ttft_s": None, "tpot_s": None, "e2e_s": None, "token_times_s": []})
            continue
        ttft = draw(st.floats(1e-3, 5))
        gaps = draw(st.lists(st.floats(1e-4, 0.5), max_size=12))
        times = list(arrival + ttft + np.concatenate([[0.0], np.cumsum(gaps)]))
        e2e = times[-1] - arrival
        out = len(times)
        rows.append({"rid": rid, "state": state, "arrival_s": arrival, "finish_s": times[-1], "prompt_tokens": 100,
                     "output_tokens": out, "prefix_cached_tokens": 0, "preemptions": 0,
                     "queue_s": draw(st.floats(0, ttft)), "ttft_s": ttft,
                     "tpot_s": (e2e - ttft) / (out - 1) if out > 1 else None, "e2e_s": e2e, "token_times_s": times})
    return pd.DataFrame(rows)


slos = st.one_of(st.none(), st.floats(0.5, 6000))


@settings(max_examples=150, deadline=None)
@given(runs(), slos, slos, slos)
def test_goodput_counts_the_finished_requests_meeting_every_slo_given(req, ttft, tpot, e2e):
    m = summarize(req, None, ttft, tpot, e2e)
    good = 0
    for r in req.itertuples():
        if r.state != "FINISHED":
            continue
        meets = (ttft is None or r.ttft_s * 1000 <= ttft) and (e2e is None or r.e2e_s * 1000 <= e2e) and \
            (tpot is None or r.output_tokens < 2 or r.tpot_s * 1000 <= tpot)  # no TPOT: meets (as vLLM)
        good += meets
    if ttft is None and tpot is None and e2e is None:
        assert m["request_goodput"] is None and "goodput" not in m and "slo_attainment" not in m
        return
    duration = max(m["duration_s"], 1e-12)
    want = good / duration if m["completed"] else 0.0
    assert m["request_goodput"] == pytest.approx(want) and m["goodput"] == m["request_goodput"]
    assert m["slo_attainment"] == pytest.approx(good / len(req))
    assert m["request_goodput"] <= m["request_throughput"] * (1 + 1e-9)
    if ttft is not None:  # a looser SLO never lowers goodput
        assert summarize(req, None, ttft * 2, tpot, e2e)["request_goodput"] >= m["request_goodput"] - 1e-9


@settings(max_examples=100, deadline=None)
@given(runs())
def test_vllm_names_and_definitions(req):
    m = summarize(req)
    done = req[req["state"] == "FINISHED"]
    assert m["completed"] == len(done) and m["failed"] == len(req) - len(done)
    assert m["completed"] + m["failed"] == m["num_requests"]
    assert m["failed"] == m["rejected"] + m["aborted"] + m["errors"] + m["unfinished"]
    if not len(done):
        assert m["mean_ttft_ms"] is None and m["std_e2el_ms"] is None
        return
    e2e = done["e2e_s"].to_numpy(float) * 1000
    assert m["mean_e2el_ms"] == pytest.approx(e2e.mean()) and m["std_e2el_ms"] == pytest.approx(e2e.std())
    for stat in ("mean", "median", "p90", "p99"):  # the names used before stay, with the same values
        assert m[f"{stat}_e2e_latency_ms"] == m[f"{stat}_e2el_ms"]
    assert m["p99_ttft_ms"] == pytest.approx(np.percentile(done["ttft_s"].to_numpy(float) * 1000, 99))
    tpot = done.loc[done["output_tokens"] > 1, "tpot_s"].to_numpy(float) * 1000  # vLLM: outputs of > 1 token
    assert (m["std_tpot_ms"] is None) == (len(tpot) == 0)
    if len(tpot):
        assert m["std_tpot_ms"] == pytest.approx(tpot.std()) and m["median_tpot_ms"] == pytest.approx(np.median(tpot))
    gaps = np.concatenate([np.diff(t) for t in done["token_times_s"]]) * 1000  # vLLM's itl: every gap
    if len(gaps):
        assert m["mean_itl_ms"] == pytest.approx(gaps.mean()) and m["std_itl_ms"] == pytest.approx(gaps.std())


def test_slo_met_and_stat_names():
    done = pd.DataFrame({"ttft_s": [0.1, 0.3], "tpot_s": [None, 0.02], "e2e_s": [0.1, 2.0]})
    assert list(slo_met(done, ttft_ms=200)) == [True, False]
    assert list(slo_met(done, tpot_ms=10)) == [True, False]  # the one-token output has no TPOT
    assert list(slo_met(done, e2e_ms=2000)) == [True, True]
    assert list(slo_met(done, ttft_ms=500, e2e_ms=1000)) == [True, False]
    assert [stat_name(s, "ttft") for s in ("mean", 99, 99.9, 50.0)] == \
        ["mean_ttft_ms", "p99_ttft_ms", "p99.9_ttft_ms", "p50_ttft_ms"]


def test_token_gaps_from_a_flat_list_column_are_the_per_request_diffs():
    import pyarrow as pa

    from testbed.timeline.metrics import token_gaps
    times = [[1.0, 1.5, 2.25], [], [3.0], None, [4.0, 4.125], [5.0, 5.5, 5.75, 7.0]]
    want = np.concatenate([np.diff(t) for t in times if t is not None and len(t) > 1])
    got = token_gaps(pa.array(times, pa.list_(pa.float64())))
    assert got.tolist() == want.tolist()
    assert token_gaps(pa.array([[1.0]], pa.list_(pa.float64()))).tolist() == []


@settings(max_examples=100, deadline=None)
@given(runs(), slos, slos, st.booleans(), st.randoms(use_true_random=False))
def test_the_writers_numpy_columns_summarize_as_the_dataframe(req, ttft, tpot, client, rng):
    """The writer hands summarize numpy columns (testbed.timeline.arrow_build: no pandas in a
    run), analysis DataFrames: the same metrics to the bit, rows added in any order; a
    client's run has no preemptions or prefix hits (nulls)."""
    from testbed.timeline.request_rows import RequestRows
    from testbed.timeline.metrics import REQUEST_COLUMNS, STEP_COLUMNS
    from testbed.timeline.schema import REQUESTS_SCHEMA
    if client:
        req = req.assign(preemptions=None, prefix_cached_tokens=None)
    records = req.astype(object).where(req.notna(), None).to_dict("records")
    rows = RequestRows(False, lambda d, keep: {f.name: d.get(f.name) for f in REQUESTS_SCHEMA})
    for d in rng.sample(records, len(records)):
        rows.add(d)
    cols = rows.columns()
    steps = pd.DataFrame({"pages_used": [3, 0, 9], "pages_cached": [1, 1, 0], "pages_free": [6, 9, 1],
                          "batch_reqs": [2, 0, 7], "evicted_pages": [0, 4, 1]})
    want = summarize(req, steps, ttft, tpot)
    assert (want["preemptions"] is None) == client
    got = summarize({c: cols[c].numpy() for c in REQUEST_COLUMNS if c != "token_times_s"},
                    {c: steps[c].to_numpy() for c in STEP_COLUMNS}, ttft, tpot,
                    token_times=(cols["token_times_s"].values, cols["token_times_s"].offsets))
    assert got == want


@pytest.mark.parametrize("n", [1, 7, 64, 65, 1000])
def test_blocked_std_is_numpys(n):
    """The population std over blocks (a run's millions of gaps are never held twice) is numpy's."""
    from testbed.timeline.metrics import _std
    v = np.random.default_rng(n).lognormal(size=n) * 20
    assert _std(v, block=64) == pytest.approx(float(v.std()), rel=1e-12, abs=1e-300)
    assert _std(v) == float(v.std())  # within one block: numpy's own


def test_gaps_in_place_are_the_gaps():
    """gaps_within over the caller's buffer gives the copy's gaps, request by request."""
    from testbed.timeline.metrics import gaps_within
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 9, 50000)
    flat = np.cumsum(rng.random(int(lens.sum())))
    want = np.concatenate([np.diff(flat[a:b]) for a, b in zip(np.cumsum(lens) - lens, np.cumsum(lens))])
    assert np.array_equal(gaps_within(flat.copy(), lens), want)
    assert np.array_equal(gaps_within(flat, lens, in_place=True), want)
