"""Analysis of testbed runs: pandas frames from run directories, metrics, run-vs-run
comparison and plots. Reads run directories (Parquet, JSON), never live objects.

    import analysis as A
    r = A.load("multirun/2026-11-29/10-00-00")   # one run or a whole sweep
    r.summaries                                  # a row per job: overrides + metrics
    A.metrics.summarize_groups(r.requests, r.steps, slo_ttft_ms=500, slo_tpot_ms=50)
    A.compare.error_summary(A.compare.join_requests(engine_dir, sim_dir))
    from analysis import plots                   # matplotlib, imported on demand
"""
from analysis import compare, metrics
from analysis.launch import run_sweep
from analysis.load import LoadError, Results, load, load_summaries

__all__ = ["load", "load_summaries", "Results", "LoadError", "metrics", "compare", "run_sweep"]
