"""The simulator driver: SimPy time, cost-model step durations. No torch."""
from testbed.sim.driver import SimDriver
from testbed.sim.executor import SimExecutor

__all__ = ["SimDriver", "SimExecutor"]
