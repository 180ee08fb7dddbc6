"""The SimPy driver: runs the step loop (testbed.steploop) on simulated time. The loop
yields the times it waits until (the next arrival, the host finishing a launch, the device
finishing a step); each becomes a SimPy timeout. fast_path: steady stretches of decode steps run
at once, with the same results (testbed/sim/fastpath.py)."""
from __future__ import annotations

import simpy

from testbed.sim.fastpath import FastPath
from testbed.steploop import StepLoop


class SimDriver(StepLoop):
    def __init__(self, scheduler, executor, requests, overlap: bool = True, progress=None, env=None,
                 fast_path: bool = True):
        """env: the SimPy environment whose clock the executor reads (a new one if None)."""
        super().__init__(scheduler, executor, requests, overlap, progress)
        self.env = env if env is not None else simpy.Environment()
        if fast_path:
            self.steady = FastPath(self, lambda: self.env.now)

    def _process(self):
        env = self.env
        for t in self.loop(lambda: env.now):
            if t > env.now:
                yield env.timeout(t - env.now)

    def run(self) -> None:
        self.env.run(until=self.env.process(self._process()))
