"""`python -m testbed.capacity [overrides] slo.ttft_ms=... [capacity.KEY=VALUE ...]`: the highest
request rate (trace.rate) whose SLO attainment stays at or above a target, per policy, in the
simulator, found by bisection.

- settings.py: the capacity.* keys of the command line and their checks
- search.py: the bisection over rates, given a function that measures one rate
- trials.py: one rate of one policy as a run (testbed.run.run) in its own run directory
- plot.py: goodput and attainment against rate (matplotlib)
- __main__.py: the command: checks, the search per policy, the table, capacity.json, the plot"""
