"""benchmarks/engine_across_starts.py: the engine's figures compared between machine starts."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("engine_across_starts", REPO / "benchmarks/engine_across_starts.py")
eas = importlib.util.module_from_spec(spec)
spec.loader.exec_module(eas)


def _start(d: Path, scale: dict[str, float]) -> Path:
    """A fidelity directory whose cells' engine runs are 10 and 12 times the cell's scale."""
    cells = {name: {"errors": {m: {"engine": [10 * k, 12 * k], "spread": 0.2} for m in eas.HEADLINE}}
             for name, k in scale.items()}
    d.mkdir()
    (d / "fidelity.json").write_text(json.dumps({"cells": cells}))
    return d


def test_between_start_differences_and_the_cell_that_moved_most(tmp_path):
    a = _start(tmp_path / "a", {"x": 1.0, "y": 1.0})
    b = _start(tmp_path / "b", {"x": 1.1, "y": 1.0, "only_b": 1.0})
    res = eas.compare({"a": eas.load(a), "b": eas.load(b)})
    assert res["cells"] == 2  # only the cells both starts ran
    r = res["metrics"]["mean_ttft_ms"]
    assert r["between_max"] == pytest.approx(1 - 1 / 1.1)  # |a / b - 1| for start a against b
    assert r["max_cell"] == "x"
    assert r["between_median"] == pytest.approx(r["between_max"] / 2)  # x moved, y did not
    assert r["within_median"] == pytest.approx(0.2)


def test_bad_input_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="fidelity.json not found"):
        eas.load(tmp_path)
    a = _start(tmp_path / "a", {"x": 1.0})
    b = _start(tmp_path / "b", {"y": 1.0})
    with pytest.raises(SystemExit, match="no cell was run on every start"):
        eas.compare({"a": eas.load(a), "b": eas.load(b)})
    with pytest.raises(SystemExit, match="two fidelity directories or more"):
        eas.main([str(a)])
