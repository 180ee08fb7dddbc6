"""benchmarks/exp_kv_layout.py on the CPU reference engine: every batch, context and share of
interleaved KV timed into the file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_times_each_layout_into_the_file(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "layout.json"
    p = subprocess.run([sys.executable, "benchmarks/exp_kv_layout.py", "--model", "smollm2_135m", "--batches", "2,4",
                        "--contexts", "24", "--interleave", "0,0.5", "--repeats", "1", "--out", str(out),
                        *(a for o in ("engine.device=cpu", "engine.attention=torch", "engine.num_pages=4096",
                                      "scheduler.max_running=8") for a in ("--set", o))],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["context"], r["interleave"]) for r in rows] == [
        (2, 24, 0.0), (2, 24, 0.5), (4, 24, 0.0), (4, 24, 0.5)]
    assert all(r["device_s"] > 0 for r in rows)
