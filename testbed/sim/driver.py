"""The SimPy driver: arrivals at their trace times, one engine process that asks the
scheduler for a plan, advances simulated time by the cost model, and applies the result."""
from __future__ import annotations

import simpy

from testbed.recording import record_step
from testbed.timeline import StepLog


class SimDriver:
    def __init__(self, scheduler, executor, requests, progress=None):
        self.sched = scheduler
        self.executor = executor
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.rid))
        self.progress = progress  # callable(done, total, now, output_tokens) or None
        self.steps = StepLog()
        self.env = simpy.Environment()
        self._wake = self.env.event()
        self._arrived = 0
        self._idle = False

    def _arrivals(self):
        env, sched = self.env, self.sched
        for r in self.requests:
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            sched.add_request(r, env.now)
            self._arrived += 1
            if self._idle and not self._wake.triggered:
                self._wake.succeed()

    def _engine(self):
        env, sched, n = self.env, self.sched, len(self.requests)
        while True:
            plan = sched.schedule(env.now)
            if plan is None:
                if self._arrived == n and not sched.has_work():
                    return
                if self._arrived == n:
                    raise RuntimeError(f"scheduler stalled at t={env.now:.3f}s with {len(sched.waiting)} waiting "
                                       f"and {len(sched.running)} running requests and nothing runnable")
                self._idle = True
                yield self._wake
                self._wake = env.event()
                self._idle = False
                continue
            start = env.now
            result = self.executor.run(plan)
            yield env.timeout(result.duration)
            sched.complete(plan, result, env.now)
            record_step(self.steps, sched, plan, start, env.now, result.duration, result.predicted)
            if self.progress is not None:
                self.progress(len(sched.done), n, env.now, self.steps.output_tokens)

    def run(self) -> None:
        self.env.process(self._arrivals())
        self.env.run(until=self.env.process(self._engine()))
