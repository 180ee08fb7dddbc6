"""benchmarks/fidelity_host_modes.py: the sampler's lines, the windows' modes, and the committed
evidence of the eighth start's host-mode runs read back as the README says."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fidelity_host_modes", REPO / "benchmarks/fidelity_host_modes.py")
hm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hm)
EVIDENCE = REPO / "benchmarks/results/fidelity/start8/host_modes"


def test_modes_thresholds():
    assert hm.modes([0.8, 1.04, 1.05, 1.2, 1.25, 1.26, 2.0]) == "FF---SS"


@pytest.mark.skipif(not Path("/proc/self/schedstat").is_file(), reason="needs Linux /proc")
def test_sample_writes_a_line_per_tick_until_the_command_ends(tmp_path):
    out = tmp_path / "samples.txt"
    # a command busy for a while (a loop, not a sleep: the sampler must see it on a CPU)
    rc = hm.sample(out, [sys.executable, "-c", "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.4: pass"],
                   every_s=0.01)
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 3
    assert all({"t", "cpu", "oncpu_ns", "runq_wait_ns", "steal", "idle"} <= set(r) for r in rows)
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert rows[-1]["oncpu_ns"] > rows[0]["oncpu_ns"]  # the command's own CPU time grows


def test_sample_passes_the_exit_status_on(tmp_path):
    assert hm.sample(tmp_path / "s.txt", [sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_sample_usage_is_one_line():
    with pytest.raises(SystemExit, match="usage"):
        hm.main(["sample", "FILE", "python"])


def test_committed_pinned_runs_switch_speed_without_steal(tmp_path, capsys):
    """The tenth start's runs (pinned to CPU 6, /proc/stat sampled): both speeds occur, on one
    CPU, with at most a tick of steal a run (start8/README.md)."""
    hm.analyse(EVIDENCE / "pinned_stat", tmp_path / "w.json")
    runs = json.loads((tmp_path / "w.json").read_text())["runs"]
    assert len(runs) == 4
    allmodes = "".join(r["modes"] for r in runs)
    assert "S" in allmodes and "F" in allmodes
    for r in runs:
        cpus = {w["cpu"] for w in r["windows"] if w["cpu"] is not None}
        assert cpus == {6}
        assert sum(w["steal_ticks"] or 0 for w in r["windows"]) <= 1
    assert "host speed" in capsys.readouterr().out
