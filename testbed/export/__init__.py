"""`python -m testbed.export DIR --format vllm|aiperf`: a run directory (either backend) in the
result formats of neighbouring benchmark tools, so dashboards made for them read simulated and
real runs alike.

- rundir.py: reads the run directory (summary.json, requests.parquet) into a RunData
- vllm_bench.py: the result JSON `vllm bench serve --save-result` writes
- aiperf.py: AIPerf's per-request records (profile_export.jsonl)

Every figure is computed from requests.parquet by testbed.timeline.metrics, the code that
wrote the run's summary.json, so the exported numbers equal the summary's."""
