"""benchmarks/exp_sustained_decode.py on the CPU reference engine: each batch, and the same beside a
prompt chunk, timed alone, back to back and alone again, every round, into the file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_times_each_batch_three_ways_into_the_file(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "sustained.json"
    p = subprocess.run([sys.executable, "benchmarks/exp_sustained_decode.py", "--model", "smollm2_135m",
                        "--batches", "2,8", "--context", "24", "--mixed-chunk", "5", "--steps", "3", "--rounds", "2",
                        "--repeats", "1",
                        "--out", str(out),
                        *(a for o in ("engine.device=cpu", "engine.attention=torch", "engine.num_pages=4096",
                                      "scheduler.max_running=8") for a in ("--set", o))],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["round"], r["batch"], r["shape"], r["phase"]) for r in rows] == [
        (r, b, k, ph) for r in range(2) for b in (2, 8) for k in ("decode", "mixed")
        for ph in ("alone", "sustained", "alone_after")]
    assert all(r["device_s"] > 0 for r in rows)
    # 8 decode rows fill max_running: beside the prompt only 7 fit
    assert {(r["shape"], r["batch"], r["rows"]) for r in rows} == {
        ("decode", 2, 2), ("mixed", 2, 3), ("decode", 8, 8), ("mixed", 8, 8)}
    assert all(r["steps"] == 3 for r in rows if r["phase"] == "sustained")
