"""benchmarks/slow_steps.py: slow decode steps counted against their batch size's line."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("slow_steps", REPO / "benchmarks/slow_steps.py")
slow_steps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slow_steps)


def _steps(n_slow: int, rng) -> pd.DataFrame:
    """Decode steps of two batch sizes on exact lines (time = a + b x context), n_slow of them
    1.5x their line, and prefill steps (never counted) far off any line."""
    rows = []
    for size, a, b in ((8, 1e-3, 1e-8), (32, 2e-3, 2e-8)):
        for _ in range(200):
            ctx = int(rng.integers(1_000, 50_000))
            rows.append((0, size, ctx, a + b * ctx))
    for i in range(n_slow):
        p, size, ctx, d = rows[i * 7]
        rows[i * 7] = (p, size, ctx, 1.5 * d)
    rows += [(1, 8, 5_000, 1.0)] * 20
    return pd.DataFrame(rows, columns=["prefill_reqs", "batch_reqs", "context_tokens", "duration_s"])


def test_counts_the_slow_decode_steps_of_runs_and_of_a_profile(tmp_path):
    rng = np.random.default_rng(0)
    for run in ("r1", "r2"):
        (tmp_path / run).mkdir()
        _steps(10, rng).to_parquet(tmp_path / run / "steps.parquet")
    got = slow_steps.summary(str(tmp_path / "r*" / "steps.parquet"))
    assert got["decode_steps"] == 800
    assert got["slow_share"] == pytest.approx(20 / 800)
    assert 20 / 800 < got["slow_time_share"] < 2 * 20 / 800  # 1.5x their line, the fit pulled a little up

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"samples": {"host": _steps(0, rng).to_dict(orient="list")}}))
    got = slow_steps.summary(str(prof))
    assert got["decode_steps"] == 400 and got["slow_share"] == 0.0


def test_bad_sources_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match="no steps.parquet file matches"):
        slow_steps.summary(str(tmp_path / "none" / "*.parquet"))
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"samples": {}}))
    with pytest.raises(SystemExit, match="not a profile with host workload samples"):
        slow_steps.summary(str(bad))
