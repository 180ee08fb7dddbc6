"""Rank 0's executor under tensor parallelism: a wrapper of its own EngineExecutor that
broadcasts every prepared step to the other ranks before running it here like every rank."""
from __future__ import annotations

import time

from testbed.engine.batch_builder import build_host_batch
from testbed.engine.executor import sampling_lists
from testbed.engine.tp.launch import TPRanks
from testbed.engine.tp.messages import check_same_plan


class TPExecutor:
    def __init__(self, local, ranks: TPRanks, debug_hash: bool):
        self.local = local
        self.msg_group = ranks.tp.msg_group
        self.sup = ranks.supervisor
        self.debug_hash = debug_hash
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

    def fill_predictions(self, steps) -> None:
        self.local.fill_predictions(steps)

    def close(self, ran_to_end: bool) -> None:
        """Stop the ranks. When the run ran to its end (between steps): tell them to stop and wait.
        Otherwise (an error, Ctrl-C) a rank may be waiting inside a collective of the step
        that was cut short, and a goodbye message would wait for it forever: end them."""
        if self._closed:
            return
        self._closed = True
        if not ran_to_end or self.sup.dead():
            self.sup.terminate()
            return
        self._send(None)
        self.sup.close()
        import torch.distributed as dist
        dist.destroy_process_group()
