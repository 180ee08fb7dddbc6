"""benchmarks/decode_step_drift.py: decode-graph steps priced by time into the run and device busyness."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("decode_step_drift", REPO / "benchmarks/decode_step_drift.py")
drift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(drift)


def test_busy_before_is_the_device_share_of_the_second_before_each_step():
    start = np.array([0.0, 0.5, 1.0, 1.5, 3.0])
    dur = np.array([0.25, 0.25, 0.5, 0.5, 0.1])
    got = drift.busy_before(start, dur)
    # step 1: 0.25 s of the 0.5 s since the first; step 2: 0.5 s in [0, 1); step 3: steps at 0.5 and 1.0 (0.75 s) in [0.5, 1.5)
    assert got[1:].tolist() == pytest.approx([0.5, 0.5, 0.75, 0.0])


def test_bins_by_rows_and_the_column():
    df = pd.DataFrame({"rows": [4, 4, 40, 40], "since_start_s": [0.5, 7.0, 3.0, 3.5],
                       "ratio": [0.99, 1.01, 0.98, 0.96]})
    got = drift.bins(df, "since_start_s", drift.SINCE_START)
    assert [(r["rows"], r["since_start_s"], r["steps"], r["median_ratio"]) for r in got] == [
        ("1-8", "0-1", 1, 0.99), ("1-8", "5-10", 1, 1.01), ("33-64", "2-5", 2, 0.97)]


def test_decoded_tokens_counts_each_decode_rows_own_tokens():
    """A decode step holds k of a request's own tokens when it makes its token k + 1."""
    from testbed.fidelity.batches import decoded_tokens
    steps = pd.DataFrame({"end_s": [1.0, 2.0, 3.0, 4.0]})
    reqs = pd.DataFrame({"state": ["FINISHED", "FINISHED", "ABORTED"],
                         "token_times_s": [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0], [1.0, 2.0]]})
    # request 0: tokens 2, 3 at steps 1, 2 (1 and 2 own tokens); request 1: steps 2, 3; the aborted one: none
    assert decoded_tokens(reqs, steps).tolist() == [0, 1, 3, 2]


def test_large_graphs_bin_by_their_longest_row_over_the_mean():
    df = pd.DataFrame({"rows": [100, 150, 150, 170, 8], "longest_over_mean": [2.5, 1.5, 3.5, 3.2, 1.0],
                       "ratio": [1.0, 1.01, 0.96, 0.95, 1.0]})
    got = drift.bins(df, "longest_over_mean", drift.LONGEST, drift.ROWS_LONGEST)
    assert [(r["rows"], r["longest_over_mean"], r["steps"], r["median_ratio"]) for r in got] == [
        ("65-144", "2-3", 1, 1.0), ("145-160", "0-2", 1, 1.01), ("145-160", "3-4", 1, 0.96), ("161-176", "3-4", 1, 0.95)]
