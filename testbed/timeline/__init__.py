"""Per-request and per-step timelines, one schema for simulator and engine. The package holds
the step rows a run records (StepLog); the writer (testbed.timeline.writer: pyarrow.parquet)
is imported where a run ends, not before its first step."""
from testbed.timeline.steplog import StepLog

__all__ = ["StepLog"]
