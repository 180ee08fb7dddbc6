"""Per-request and per-step timelines, one schema for simulator and engine. The package holds
the step rows a run records (StepLog); the writer (testbed.timeline.writer: pyarrow.parquet)
is imported where a run ends, not before its first step."""
import os

# Before pyarrow loads (this package is where a run first imports it): its default allocator,
# mimalloc, keeps what writing a run's files took (40 MB for a 4,000-request replay's 14 MB of
# token times) until the process exits; the system's gives it back. A user's own choice stands.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

from testbed.timeline.steplog import StepLog  # noqa: E402

__all__ = ["StepLog"]
