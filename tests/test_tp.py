"""Tensor parallelism on the CPU with gloo: tp=2 gives the greedy ids of tp=1, and a rank
that dies ends the run with an error naming it, leaving no process behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import re
import sys
import threading
import time

import pandas as pd
import pytest

from engine_fixtures import ROOT, prompt_file, run_engine, save_tiny_model

pytestmark = pytest.mark.slow  # several CPU engine processes


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama_1kv"])
def test_tp2_matches_tp1(tmp_path, kind):
    model_dir = save_tiny_model(kind, tmp_path / "model")
    trace = tmp_path / "p.csv"
    prompt_file(trace, n=8, out_tokens=8)
    outs = {}
    for tp in (1, 2):
        p = run_engine(model_dir, trace, tmp_path / f"tp{tp}", f"engine.tp={tp}", "engine.debug_plan_hash=true",
                       "policy.token_budget=48")
        assert p.returncode == 0, p.stderr[-3000:]
        req = pd.read_parquet(tmp_path / f"tp{tp}" / "requests.parquet").sort_values("rid")
        assert set(req["state"]) == {"FINISHED"}
        outs[tp] = [list(x) for x in req["output_ids"]]
    assert outs[1] == outs[2]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _cmdline(pid: int) -> str:
    try:  # /proc, not ps: ps cuts long command lines
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


class _Stderr:
    """A process's stderr read in a thread, so a test can wait on what the run says."""

    def __init__(self, proc):
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(proc.stderr.fileno(),), daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        while chunk := os.read(fd, 4096):
            self.text += chunk.decode(errors="replace")

    def finished(self) -> int:
        """Requests finished, by the progress bar's last update (0 before the first)."""
        counts = re.findall(r"\| *(\d+)/\d+ \[", self.text)
        return int(counts[-1]) if counts else 0

    def all(self, timeout: float = 30) -> str:
        """Everything, once the process has closed its stderr."""
        self._thread.join(timeout)
        return self.text


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out after {timeout:.0f} s waiting until {what}"
        time.sleep(0.1)


def _start_long_run(model_dir, out, tp: int):
    """The run, its worker ranks once they are up, and its stderr (progress bar on)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.run", "backend=engine", "engine.device=cpu", "engine.attention=torch",
         "engine.dtype=float32", f"model.path={model_dir}", f"engine.tp={tp}", "trace=synthetic",
         "trace.num_requests=100000", "trace.rate=50", "trace.prompt_len_max=200", "trace.output_len_max=64",
         "progress=true", f"hydra.run.dir={out}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = _Stderr(proc)
    workers: list[int] = []

    def up() -> bool:
        workers[:] = [c for c in _children(proc.pid) if "spawn_main" in _cmdline(c)]
        return len(workers) >= tp - 1 or proc.poll() is not None
    _wait(up, 180, "the tensor-parallel ranks are up")
    return proc, workers, err


def _ranks_gone(workers) -> bool:
    return not [w for w in workers if _alive(w)]


def _stop(proc, workers) -> None:
    """Whatever the test found, leave nothing running behind it."""
    for pid in [proc.pid, *workers]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)


def test_killed_rank_ends_the_run(tmp_path):
    """Three ranks; rank 1 is killed: the run ends naming it, and rank 2 does not outlive it."""
    model_dir = save_tiny_model("llama_6h", tmp_path / "model")
    out = tmp_path / "run"
    proc, workers, err = _start_long_run(model_dir, out, tp=3)
    try:
        assert len(workers) == 2, "the tensor-parallel worker processes did not appear"
        _wait(lambda: err.finished() >= 1 or proc.poll() is not None, 300, "a request has finished")
        os.kill(min(workers), signal.SIGKILL)  # the ranks start in order: rank 1
        proc.wait(120)
        stderr = err.all()
        assert proc.returncode == 1, stderr[-2000:]
        assert "rank 1 exited with code -9" in stderr.splitlines()[-1]
        assert (out / "requests.parquet").exists() and (out / "summary.json").exists()
        _wait(lambda: _ranks_gone(workers), 10, "every tensor-parallel rank has exited")
    finally:
        _stop(proc, workers)


def test_ctrl_c_stops_every_rank(tmp_path):
    """Ctrl-C mid-run (a rank may be inside a collective): results written, every rank gone, fast."""
    model_dir = save_tiny_model("llama", tmp_path / "model")
    out = tmp_path / "run"
    proc, workers, err = _start_long_run(model_dir, out, tp=2)
    try:
        assert len(workers) == 1, "the tensor-parallel worker process did not appear"
        _wait(lambda: err.finished() >= 1 or proc.poll() is not None, 300, "a request has finished")
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        stderr = err.all()
        assert proc.returncode == 130, stderr[-2000:]
        assert time.time() - t0 < 30
        s = json.loads((out / "summary.json").read_text())
        assert s["complete"] is False and s["metrics"]["completed"] > 0
        _wait(lambda: _ranks_gone(workers), 10, "every tensor-parallel rank has exited")
    finally:
        _stop(proc, workers)


def test_a_rank_dying_during_start_up_ends_the_run_at_once(tmp_path):
    """A rank killed while the group is still starting: rank 0 (blocked joining the group)
    ends at once, the error on stderr names the rank, nothing is left running."""
    model_dir = save_tiny_model("llama", tmp_path / "model")
    out = tmp_path / "run"
    proc, workers, err = _start_long_run(model_dir, out, tp=2)
    try:
        assert len(workers) == 1, "the tensor-parallel worker process did not appear"
        t0 = time.time()
        os.kill(workers[0], signal.SIGKILL)
        proc.wait(60)
        stderr = err.all()
        assert proc.returncode == 1, stderr[-2000:]
        assert time.time() - t0 < 12  # not the mid-run grace (15 s) that lets rank 0 write its results
        last = stderr.strip().splitlines()[-1]
        assert "rank 1 exited with code -9" in last and "start-up" in last
        assert not (out / "summary.json").exists()  # nothing was run
    finally:
        _stop(proc, workers)
