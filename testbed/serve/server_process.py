"""`python -m testbed.serve` in a child process, for scripts and notebooks that drive a server
(a benchmark, the tests): started on a free local port, ready once /health answers, its log
in a file beside its run directory, stopped with Ctrl-C so it writes what it served."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the tree this testbed is imported from


class ServerError(RuntimeError):
    """The server exited, or did not answer /health in time; the message names its log."""


def child_env() -> dict:
    """The environment for a child that runs this testbed: this tree first on its path, then
    whatever the caller's PYTHONPATH held (a --target site of the engine's wheels)."""
    path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, overrides: list[str], out: Path, start_s: float, python_args: tuple[str, ...] = ()):
        """overrides: testbed.serve's (its port and run directory are set here); out: its run
        directory (requests.parquet, steps.parquet, summary.json when it stops), its log at
        OUT.log; start_s: how long model load and warm-up may take before /health answers;
        python_args: before `-m testbed.serve` (`-m cProfile -o FILE` profiles the HTTP app's process)."""
        import httpx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = Path(out)
        self.log_path = self.out.parent / f"{self.out.name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, *python_args, "-m", "testbed.serve", *overrides, f"serve.port={self.port}", f"hydra.run.dir={self.out}"],
            cwd=PACKAGE_ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=child_env())
        deadline = time.monotonic() + start_s
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                raise ServerError(f"the server exited with {self.proc.returncode}; its log ({self.log_path}) ends:\n"
                                  f"{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(f"the server did not answer /health in {start_s} s; its log: {self.log_path}")
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text()

    def pids(self) -> dict[str, int]:
        """Each process of the server by name: the app (this child: the launcher runs the HTTP
        app) and the workers, as their ready lines in the log name them."""
        import re
        return {"app": self.proc.pid, **{m[1]: int(m[2]) for m in re.finditer(r"(\S+) \(pid (\d+)\) ready", self.log())}}

    def metrics(self) -> dict[str, float]:
        """/metrics as name -> value."""
        import httpx
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                         if line and not line.startswith("#"))}

    def stop(self, sig=signal.SIGINT, timeout: float = 120) -> int:
        """Ctrl-C (by default): the server writes its files and exits; its exit status."""
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
