"""Per-request and per-step timelines, one schema for simulator and engine."""
from testbed.timeline.metrics import summarize
from testbed.timeline.schema import REQUESTS_SCHEMA, STEPS_SCHEMA
from testbed.timeline.writer import StepLog, requests_table, write_run

__all__ = ["summarize", "REQUESTS_SCHEMA", "STEPS_SCHEMA", "StepLog", "requests_table", "write_run"]
