"""The real-time driver: arrivals fed by the wall clock (trace times), steps run on the
engine, with overlap scheduling (the CPU schedules and prepares step N+1 while the
device runs step N) on by default."""
from __future__ import annotations

import time

from testbed.recording import record_step
from testbed.timeline import StepLog


class RealtimeDriver:
    def __init__(self, scheduler, executor, requests, overlap: bool = True, progress=None):
        self.sched = scheduler
        self.executor = executor
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.rid))
        self.overlap = overlap
        self.progress = progress
        self.steps = StepLog()
        self._t0 = 0.0
        self.ran_to_end = False  # run() returned normally (no step cut short)

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def _finish(self, handle) -> None:
        result = self.executor.collect(handle)
        now = self.now()
        self.sched.complete(handle.plan, result, now)
        record_step(self.steps, self.sched, handle.plan, handle.t_launch - self._t0, now, result.duration,
                    result.predicted)
        if self.progress is not None:
            self.progress(len(self.sched.done), len(self.requests), now, self.steps.output_tokens)

    def run(self) -> None:
        sched, reqs = self.sched, self.requests
        n, nxt = len(reqs), 0
        inflight = None
        self._t0 = time.perf_counter()
        while True:
            now = self.now()
            while nxt < n and reqs[nxt].arrival <= now:
                sched.add_request(reqs[nxt], now)
                nxt += 1
            plan = sched.schedule(now)
            handle = self.executor.launch(plan) if plan is not None else None
            finished_one = inflight is not None
            if inflight is not None:
                self._finish(inflight)
                inflight = None
            if handle is not None:
                if self.overlap:
                    inflight = handle
                else:
                    self._finish(handle)
                continue
            if finished_one:  # its results may make something runnable
                continue
            if nxt == n and not sched.has_work():
                self.ran_to_end = True
                return
            if nxt == n:
                raise RuntimeError(f"scheduler stalled with {len(sched.waiting)} waiting and "
                                   f"{len(sched.running)} running requests and nothing runnable")
            if not sched.has_work():  # idle: sleep until the next arrival
                time.sleep(max(0.0, reqs[nxt].arrival - self.now()))
