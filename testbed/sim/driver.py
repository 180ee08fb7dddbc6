"""The SimPy driver: runs the step loop (testbed.steploop) on simulated time. The loop
yields the times it waits until (the next arrival, the host finishing a launch, the device
finishing a step); each becomes a SimPy timeout."""
from __future__ import annotations

import simpy

from testbed.steploop import StepLoop


class SimDriver(StepLoop):
    def __init__(self, scheduler, executor, requests, overlap: bool = True, progress=None, env=None):
        """env: the SimPy environment whose clock the executor reads (a new one if None)."""
        super().__init__(scheduler, executor, requests, overlap, progress)
        self.env = env if env is not None else simpy.Environment()

    def _process(self):
        env = self.env
        for t in self.loop(lambda: env.now):
            if t > env.now:
                yield env.timeout(t - env.now)

    def run(self) -> None:
        self.env.run(until=self.env.process(self._process()))
