"""Starts the server's processes (scheduler + engine, detokenizer, N tokenizers; spawned),
waits until each says it is ready, runs the HTTP app in this process, and watches the
others: one that dies takes the server down with one line naming it. Ctrl-C / SIGTERM ends
every request, lets the scheduler write the run's files, and stops every process."""
from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing import connection

import zmq

from testbed.serve.channels import Channels, push
from testbed.serve.messages import Shutdown

log = logging.getLogger("testbed.serve")
WRITE_TIMEOUT_S = 300  # for the scheduler to finish its steps and write the run's files
STOP_TIMEOUT_S = 10  # for the other workers to exit once told


class StartError(RuntimeError):
    """A worker could not start (its own one-line reason), or the port is taken."""


@dataclass
class Worker:
    name: str
    process: multiprocessing.Process
    conn: connection.Connection  # its ready / error line

    def describe_exit(self) -> str:
        code = self.process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"the {self.name} process (pid {self.process.pid}) died ({how})"


def check_port(host: str, port: int) -> None:
    """Before the minutes of model loading: a port in use fails now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise StartError(f"cannot listen on {host}:{port} ({e.strerror}); choose another serve.port") from None


class Launcher:
    def __init__(self, cfg, out_dir: str, tokenizer_dir: str, spec):
        self.cfg, self.out_dir, self.tokenizer_dir, self.spec = cfg, out_dir, tokenizer_dir, spec
        self.ipc_dir = tempfile.TemporaryDirectory(prefix="testbed-serve-")
        self.ch = Channels.in_dir(self.ipc_dir.name)
        self.mp = multiprocessing.get_context("spawn")  # no forked copy of this process's threads and sockets
        self.workers: list[Worker] = []
        self.died: str | None = None
        self._stopping = threading.Event()
        self._zmq = zmq.Context()
        self._to_scheduler = push(self._zmq, self.ch.scheduler)

    def start_workers(self) -> None:
        from testbed.serve import detokenizer_worker, scheduler_worker, tokenizer_worker
        self._start("scheduler", scheduler_worker.main, self.cfg, self.ch, self.out_dir)
        self._start("detokenizer", detokenizer_worker.main, self.ch, self.tokenizer_dir)
        for i in range(self.cfg.serve.tokenizer_workers):
            self._start(f"tokenizer-{i}", tokenizer_worker.main, i, self.ch, self.tokenizer_dir,
                        self.spec.max_context, self.spec.vocab_size)
        self._wait_ready()

    def _start(self, name: str, target, *args) -> None:
        r, w = self.mp.Pipe(duplex=False)
        p = self.mp.Process(target=target, args=(*args, w), name=name)
        p.start()
        w.close()
        self.workers.append(Worker(name, p, r))

    def _wait_ready(self) -> None:
        waiting = {w.conn: w for w in self.workers}
        sentinels = {w.process.sentinel: w for w in self.workers}
        while waiting:
            for obj in connection.wait(list(waiting) + list(sentinels)):
                w = waiting.get(obj)
                if w is not None:
                    try:
                        kind, what = obj.recv()
                    except EOFError:  # exited without a word: its sentinel says how
                        continue
                    if kind == "error":
                        raise StartError(f"{w.name} could not start: {what}")
                    log.info("%s (pid %d) ready", w.name, w.process.pid)
                    del waiting[obj]
                elif sentinels[obj].conn in waiting:
                    w = sentinels[obj]
                    w.process.join()
                    raise StartError(f"{w.describe_exit()} while starting")

    def watch(self, on_death) -> threading.Thread:
        """A thread that calls on_death(line) when a worker dies while the server runs."""
        def run():
            sentinels = {w.process.sentinel: w for w in self.workers}
            while not self._stopping.is_set():
                dead = connection.wait(list(sentinels), timeout=0.5)
                if dead and not self._stopping.is_set():
                    w = sentinels[dead[0]]
                    w.process.join()
                    self.died = w.describe_exit()
                    log.error("error: %s; shutting the server down", self.died)
                    on_death(self.died)
                    return
        t = threading.Thread(target=run, name="worker-watch", daemon=True)
        t.start()
        return t

    def tell_scheduler_to_stop(self) -> None:
        """Every request ends (abort); the scheduler finishes, writes the run's files and exits."""
        self._to_scheduler.send_pyobj(Shutdown())

    def stop_workers(self) -> int | None:
        """The scheduler writes what was served first; the others are stopped after it.
        Returns the scheduler's exit code (None: it had to be killed)."""
        self._stopping.set()
        sched = next((w for w in self.workers if w.name == "scheduler"), None)
        code = None
        if sched is not None and sched.process.is_alive():
            self.tell_scheduler_to_stop()
            sched.process.join(WRITE_TIMEOUT_S)
        if sched is not None:
            code = sched.process.exitcode
        for w in self.workers:
            if w.process.is_alive():
                w.process.terminate()
        for w in self.workers:
            w.process.join(STOP_TIMEOUT_S)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        self._to_scheduler.close(linger=0)
        self._zmq.term()
        self.ipc_dir.cleanup()
        return code


def serve(cfg, out_dir: str, tokenizer_dir: str, spec) -> int:
    """Run the server until Ctrl-C / SIGTERM or a worker's death; returns the exit code."""
    import asyncio

    import uvicorn

    from testbed.serve.app import ServerState, make_app
    check_port(cfg.serve.host, cfg.serve.port)
    launcher = Launcher(cfg, out_dir, tokenizer_dir, spec)
    signals: list[int] = []
    old = {s: signal.signal(s, lambda sig, frame: signals.append(sig)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in old:  # while loading, a signal stops the start (nothing is written)
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT else _terminate)
        launcher.start_workers()
        for s in old:  # uvicorn puts back what it finds, then raises the signal it caught again
            signal.signal(s, lambda sig, frame: signals.append(sig))
        name = cfg.serve.model_name or cfg.model.name
        state = ServerState(launcher.ch, name, spec.max_context)

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):  # first end every request, so the streams close
                if not self.should_exit:
                    log.info("shutting down: every request still running is aborted")
                    launcher.tell_scheduler_to_stop()
                super().handle_exit(sig, frame)

        server = Server(uvicorn.Config(make_app(state), host=cfg.serve.host, port=cfg.serve.port,
                                       log_level="info", access_log=False, timeout_graceful_shutdown=10))
        loop_box: list = []

        def on_death(line: str) -> None:
            loop = loop_box[0] if loop_box else None
            if loop is not None:
                loop.call_soon_threadsafe(state.fail, f"the server is shutting down: {line}")
            server.should_exit = True

        async def main():
            loop_box.append(asyncio.get_running_loop())
            await server.serve()
        launcher.watch(on_death)
        log.info("serving %s at http://%s:%d (run directory %s)", name, cfg.serve.host, cfg.serve.port, out_dir)
        asyncio.run(main())
    finally:
        code = launcher.stop_workers()
        for s, h in old.items():
            signal.signal(s, h)
    if launcher.died:
        return 1
    if code != 0:
        log.error("error: the scheduler exited with code %s; see its lines above", code)
        return 1
    log.info("stopped; what was served is in %s", out_dir)
    return 0


def _terminate(signum, frame):
    from testbed.run import Terminated
    raise Terminated
