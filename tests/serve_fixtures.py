"""A testbed.serve server in a subprocess, for the serving tests (testbed.serve.server_process
on the tests' model: the CPU, float32), polling for a condition, and a child process that takes
Ctrl-C as one started from a terminal."""
from __future__ import annotations

import signal
import time
from pathlib import Path

from testbed.serve.server_process import ServerProcess, free_port  # noqa: F401  (free_port: the client tests')

ROOT = Path(__file__).resolve().parents[1]
START_S = 240  # model load, warm-up and four processes' imports on a loaded 2-core machine


def wait_for(cond, timeout: float, what: str, step: float = 0.05):
    """cond()'s first truthy value, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def default_sigint() -> None:
    """A child's preexec_fn: Ctrl-C delivered as to a run started from a terminal. Under a job that
    ignores SIGINT (a script's background job, nohup) the child would inherit the ignoring and
    never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Server(ServerProcess):
    def __init__(self, model_dir: Path, out: Path, *overrides: str):
        super().__init__([f"model.path={model_dir}", "engine.device=cpu", "engine.dtype=float32",
                          "serve.model_name=tiny", *overrides], out, START_S)
