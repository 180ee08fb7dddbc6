"""A testbed.serve server in a subprocess, for the serving tests: started on a free port,
ready once /health answers, its log lines in a file."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
START_S = 240  # model load, warm-up and four processes' imports on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, what: str, step: float = 0.05):
    """cond()'s first truthy value, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Server:
    def __init__(self, model_dir: Path, out: Path, *overrides: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = out
        self.log_path = out.parent / f"{out.name}.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "testbed.serve", f"model.path={model_dir}", "engine.device=cpu",
                "engine.dtype=float32", f"serve.port={self.port}", "serve.model_name=tiny",
                f"hydra.run.dir={out}", *overrides]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        wait_for(self._healthy, START_S, f"the server's /health (log: {self.log_path})", step=0.2)

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text()

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                         if line and not line.startswith("#"))}

    def stop(self, sig=signal.SIGINT, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
