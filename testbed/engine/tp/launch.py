"""Start the tensor-parallel ranks (rank 0 is this process), and stop them all on the way
out: normally, on an error, on Ctrl-C, or when a rank dies (the run then ends with an
error naming it; no rank is left behind)."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import threading
import time

import torch

from testbed.assemble import make_scheduler
from testbed.modelspec import check_tp_split
from testbed.engine.batch_builder import build_host_batch
from testbed.engine.build import (EngineParts, create_pool, engine_device, engine_info, kv_slots, load_model_for,
                                  make_executor, make_graphs, make_pieces, warm_up_engine)
from testbed.engine.driver import RealtimeDriver
from testbed.engine.executor import sampling_lists
from testbed.engine.tp.messages import check_same_plan
from testbed.engine.tp.worker import agree_kv_slots, init_group, share_cpu, worker_main

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankSupervisor:
    """Owns the worker processes; a watchdog ends the run if one dies while rank 0 is
    blocked in a collective that would otherwise wait for it."""

    def __init__(self, procs, grace_s: float = 15.0):
        self.procs = procs  # rank -> Process
        self.grace_s = grace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def dead(self) -> list[str]:
        return [f"rank {r} exited with code {p.exitcode}" for r, p in self.procs.items()
                if p.exitcode is not None and p.exitcode != 0]

    def _watch(self) -> None:
        first_seen = None
        while not self._stop.wait(0.5):
            if self.dead():
                first_seen = first_seen or time.monotonic()
                if time.monotonic() - first_seen > self.grace_s:  # rank 0 is stuck: end it all
                    log.error("tensor parallel: %s; stopping", "; ".join(self.dead()))
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


class TPExecutor:
    """Rank 0's executor: broadcast the prepared step, then run it locally like every rank."""

    def __init__(self, local, msg_group, supervisor: RankSupervisor, debug_hash: bool):
        self.local = local
        self.msg_group = msg_group
        self.sup = supervisor
        self.debug_hash = debug_hash
        self.cuda = local.cuda
        self.cost_model = local.cost_model
        self.graphs = local.graphs
        self.pieces = local.pieces
        self._closed = False

    def _failure(self, e: Exception) -> RuntimeError:
        """A collective failed: name the rank that died (it may take a moment to be seen dead)."""
        deadline = time.monotonic() + 5.0
        while not self.sup.dead() and time.monotonic() < deadline:
            time.sleep(0.1)
        dead = self.sup.dead()
        return RuntimeError(f"tensor parallel: {'; '.join(dead)}" if dead else f"tensor parallel: a collective failed: {e}")

    def _send(self, obj) -> None:
        import torch.distributed as dist
        try:
            dist.broadcast_object_list([obj], src=0, group=self.msg_group)
        except Exception as e:
            raise self._failure(e) from None

    def launch(self, plan):
        t = time.perf_counter()
        sched = self.local.sched
        hb = build_host_batch(plan, sched.page_table.table, sched.page_size)
        self.local.predictions.note(plan)  # predicted after the run
        return self.launch_host(hb, sampling_lists(plan, hb), plan, None, t)

    def fill_predictions(self, steps) -> None:
        self.local.fill_predictions(steps)

    def launch_host(self, hb, sampling, plan=None, predicted=None, t_launch=None):
        """Send a prepared step to every rank and run it here (warm-up launches these directly)."""
        self._send((hb, sampling))
        if self.debug_hash:
            check_same_plan(hb, self.msg_group, 0)
        try:
            return self.local.launch_host(hb, sampling, plan, predicted, t_launch)
        except Exception as e:
            raise self._failure(e) from None

    def collect(self, handle):
        try:
            return self.local.collect(handle)
        except Exception as e:
            raise self._failure(e) from None

    def close(self, graceful: bool) -> None:
        """Stop the ranks. Graceful (the run ended between steps): tell them to stop and wait.
        Otherwise (an error, Ctrl-C) a rank may be waiting inside a collective of the step
        that was cut short, and a goodbye message would wait for it forever: end them."""
        if self._closed:
            return
        self._closed = True
        if not graceful or self.sup.dead():
            self.sup.terminate()
            return
        self._send(None)
        self.sup.close()
        import torch.distributed as dist
        dist.destroy_process_group()


def build_tp_engine(cfg, spec, requests):
    e = cfg.engine
    world = e.tp
    check_tp_split(spec, world)
    device = engine_device(cfg, 0)
    if device.type == "cuda":
        if torch.cuda.device_count() < world:
            raise ValueError(f"engine.tp={world} needs {world} GPUs, {torch.cuda.device_count()} visible")
        torch.cuda.set_device(device)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    else:
        share_cpu(world)
    port = _free_port()
    ctx = mp.get_context("spawn")
    procs = {r: ctx.Process(target=worker_main, args=(r, world, port, cfg, spec), daemon=True, name=f"tp-rank-{r}")
             for r in range(1, world)}
    for p in procs.values():
        p.start()
    sup = RankSupervisor(procs)
    try:
        group, msg_group = init_group(0, world, port, device.type == "cuda")
        model, report = load_model_for(cfg, spec, device, 0, world, group)
        slots = agree_kv_slots(kv_slots(cfg, model, device), msg_group)
        create_pool(model, slots, e.page_size)
        sched = make_scheduler(cfg, spec, slots // e.page_size)
        graphs = make_graphs(cfg, model, device, slots // e.page_size, spec.max_context)
        pieces = make_pieces(cfg, model, device, slots // e.page_size)
        local = make_executor(cfg, spec, EngineParts(device, model, slots, graphs, report, None, pieces), sched)
    except BaseException:
        sup.terminate()
        raise
    executor = TPExecutor(local, msg_group, sup, e.debug_plan_hash)
    try:
        warm = warm_up_engine(cfg, spec, executor, slots, device)  # every rank runs the same warm-up steps
    except BaseException:
        executor.close(graceful=False)
        raise
    driver = RealtimeDriver(sched, executor, requests, overlap=e.overlap)
    driver.close = lambda: executor.close(graceful=driver.ran_to_end)
    return driver, sched, engine_info(cfg, sched, device, report, executor) | {"warmup_s": warm}
