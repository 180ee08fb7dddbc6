"""The fidelity experiment: the engine and the simulator on the same cells (model x policy
x trace x load), compared metric by metric. `python -m testbed.fidelity --help`."""
