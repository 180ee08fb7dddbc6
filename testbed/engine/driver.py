"""The wall-clock driver: runs the step loop (testbed.steploop) in real time, sleeping
while it waits for the next arrival; the engine's own work (host and device) takes the
time it takes."""
from __future__ import annotations

import time

from testbed.steploop import StepLoop


class RealtimeDriver(StepLoop):
    def __init__(self, scheduler, executor, requests, overlap: bool = True, progress=None):
        super().__init__(scheduler, executor, requests, overlap, progress)
        self._t0 = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def run(self) -> None:
        self._t0 = time.perf_counter()
        for t in self.loop(self.now):
            wait = t - self.now()
            if wait > 0:
                time.sleep(wait)
