"""The wall-clock driver: runs the step loop (testbed.steploop) in real time, waiting for
the next arrival; the engine's own work (host and device) takes the time it takes.

A wait sleeps, but spins its last SPIN_S: on the H200 machine (a VM) the first step after
the process slept for a millisecond or more took 2.05x the host time of the steps around it
(the profile's wake factor), which made the engine's latencies follow how often it went
idle. With the spin it took 1.63x (the profiles of 2026-12-01)."""
from __future__ import annotations

import time

from testbed.steploop import StepLoop


SPIN_S = 0.005  # the end of each wait that is spun instead of slept


def wait_until(clock, t: float) -> None:
    """Return once clock() >= t: sleep while more than SPIN_S is left, then spin."""
    left = t - clock()
    if left > SPIN_S:
        time.sleep(left - SPIN_S)
    while clock() < t:
        pass


class RealtimeDriver(StepLoop):
    def __init__(self, scheduler, executor, requests=(), overlap: bool = True, progress=None, feed=None):
        super().__init__(scheduler, executor, requests, overlap, progress, feed)
        #: t=0 of the run's timelines as a time.perf_counter() value (CLOCK_MONOTONIC on Linux:
        #: shared by the machine's processes, so another process's times can be put on this clock)
        self.clock_origin: float | None = None

    def now(self) -> float:
        return time.perf_counter() - self.clock_origin

    def start_clock(self) -> None:
        """t=0: when run() starts, unless started before (a server starts it before it takes requests)."""
        self.clock_origin = time.perf_counter()

    def run(self) -> None:
        if self.clock_origin is None:
            self.start_clock()
        for t in self.loop(self.now):
            self.wait(t)

    def wait(self, t: float) -> None:
        """Until the loop's time t (a server's driver also wakes when a message arrives)."""
        wait_until(self.now, t)
