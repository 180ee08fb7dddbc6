"""Start the tensor-parallel ranks (rank 0 is this process), and stop them all on the way
out: normally, on an error, on Ctrl-C, or when a rank dies (the run then ends with an
error naming it; no rank is left behind)."""
from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import torch

from testbed.engine.build import engine_device
from testbed.engine.tp.group import TPGroup, init_group, share_cpu
from testbed.engine.tp.worker import worker_main
from testbed.modelspec import check_tp_split

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankSupervisor:
    """Owns the worker processes; a watchdog ends the run if one dies while rank 0 is
    blocked in a collective that would otherwise wait for it. Mid-run it gives rank 0
    `grace_s` to see the death itself and write what was done; during start-up (before
    `started()`) nothing is done yet, so it ends the run at once, naming the rank."""

    def __init__(self, procs, grace_s: float = 15.0):
        self.procs = procs  # rank -> Process
        self.grace_s = grace_s
        self.starting = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def dead(self) -> list[str]:
        return [f"rank {r} exited with code {p.exitcode}" for r, p in self.procs.items()
                if p.exitcode is not None and p.exitcode != 0]

    def started(self) -> None:
        """Every rank has built its engine and warmed up: the run proper begins."""
        self.starting = False

    def _watch(self) -> None:
        first_seen = None
        while not self._stop.wait(0.2):
            if self.dead():
                first_seen = first_seen or time.monotonic()
                if self.starting or time.monotonic() - first_seen > self.grace_s:  # rank 0 is stuck: end it all
                    when = "during start-up, nothing was run" if self.starting else "stopping"
                    msg = f"error: tensor parallel: {'; '.join(self.dead())} ({when})"
                    log.error(msg.removeprefix("error: "))
                    print(msg, file=sys.stderr, flush=True)
                    self.terminate()
                    os._exit(1)

    def terminate(self) -> None:
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        for p in self.procs.values():
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        self.terminate()


@dataclass
class TPRanks:
    """Rank 0's view of the running group: its own place in it and the other ranks' processes."""
    tp: TPGroup
    supervisor: RankSupervisor

    @contextlib.contextmanager
    def stopped_on_error(self):
        """Ends every rank if the block fails (building rank 0's shard, the warm-up): the
        others would wait for rank 0 in a collective forever."""
        try:
            yield
        except BaseException:
            self.supervisor.terminate()
            raise


def start_ranks(settings, spec) -> TPRanks:
    """Ranks 1..tp-1 in processes of their own, each building its shard from `settings` and
    `spec`; returns once this process has joined the group as rank 0."""
    world = settings.tp
    check_tp_split(spec, world)
    device = engine_device(settings, 0)
    if device.type == "cuda":
        if torch.cuda.device_count() < world:
            raise ValueError(f"engine.tp={world} needs {world} GPUs, {torch.cuda.device_count()} visible")
        torch.cuda.set_device(device)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    else:
        share_cpu(world, settings.cpu_threads)
    port = _free_port()
    ctx = mp.get_context("spawn")
    procs = {r: ctx.Process(target=worker_main, args=(r, world, port, settings, spec), daemon=True,
                            name=f"tp-rank-{r}") for r in range(1, world)}
    for p in procs.values():
        p.start()
    sup = RankSupervisor(procs)
    try:
        tp = init_group(0, world, port, device.type == "cuda")
    except BaseException:
        sup.terminate()
        raise
    return TPRanks(tp, sup)
