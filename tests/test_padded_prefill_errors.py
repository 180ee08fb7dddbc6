"""benchmarks/padded_prefill_errors.py: the fidelity runs' eager steps priced, by tokens and padding."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("padded_prefill_errors", REPO / "benchmarks/padded_prefill_errors.py")
ppe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ppe)
CELL = "qwen3_0_6b-prefill_first-sharegpt-light"


def test_bins_by_kind_tokens_and_padding():
    df = pd.DataFrame({"mixed": [False, False, False, True], "tokens": [5170, 5200, 5632, 300],
                       "padding": [0.082, 0.077, 0.0, 0.0625], "ratio": [1.07, 1.05, 0.98, 1.0]})
    rows = ppe.table(df)
    assert {(r["kind"], r["tokens"], r["padding"], r["steps"], r["median_ratio"]) for r in rows} == {
        ("prefill", "4097-8192", "0.050-0.100", 2, 1.06), ("prefill", "4097-8192", "0.000-0.001", 1, 0.98),
        ("mixed", "257-1024", "0.050-0.100", 1, 1.0)}


def test_prices_a_committed_cells_steps_and_writes_the_file(tmp_path):
    src = REPO / "benchmarks/results/fidelity"
    plan = [c for c in json.loads((src / "plan.json").read_text()) if c["name"] == CELL]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    shutil.copytree(src / "runs" / CELL, tmp_path / "runs" / CELL)
    steps = ppe.eager_steps([tmp_path], "qwen3_0_6b")
    # nearly every prompt of this light prefill_first cell is an eager step of its own, in each
    # of the two runs (a step whose time another shares is left out: its batch is unknown)
    assert 70 <= len(steps) <= 2 * 40 and not steps["mixed"].any()
    assert steps["padding"].between(0, 1).all() and (steps["padding"] > 0).any()
    assert 0.9 < steps["ratio"].median() < 1.1
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "benchmarks/padded_prefill_errors.py", "--dirs", str(tmp_path),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert sum(r["steps"] for r in json.loads(out.read_text())["bins"]) == len(steps)
    p = subprocess.run([sys.executable, "benchmarks/padded_prefill_errors.py", "--dirs", str(tmp_path),
                        "--model", "llama3_8b"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1 and p.stderr.startswith("error: no eager steps of model 'llama3_8b'")
