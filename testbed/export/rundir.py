"""A run directory as the exporters read it: its summary, its requests, and when it started."""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

class ExportError(ValueError):
    """A run directory that cannot be exported; the message is one line."""


@dataclass
class RunData:
    path: Path
    summary: dict
    requests: pd.DataFrame  # requests.parquet, by rid
    started: datetime.datetime  # wall clock at t=0 of the timelines (UTC)
    started_from: str  # where `started` comes from

    @property
    def config(self) -> dict:
        return self.summary.get("config") or {}

    @property
    def slo(self) -> tuple:
        """(ttft_ms, tpot_ms, e2e_ms) the run was written with; None for each not given."""
        s = self.config.get("slo") or {}
        return s.get("ttft_ms"), s.get("tpot_ms"), s.get("e2e_ms")

    @property
    def backend(self) -> str:
        return str(self.summary.get("backend") or (self.config.get("backend") or {}).get("name") or "unknown")

    @property
    def started_ns(self) -> int:
        return (self.started - EPOCH) // datetime.timedelta(microseconds=1) * 1000  # exact: no float

    def name_of(self, group: str) -> str | None:
        return (self.config.get(group) or {}).get("name")


def read_run(path: str | Path) -> RunData:
    d = Path(path)
    if not d.exists():
        raise ExportError(f"{d}: no such directory")
    if not d.is_dir():
        raise ExportError(f"{d}: not a directory (give a run directory: the one holding summary.json)")
    summary_path, requests_path = d / "summary.json", d / "requests.parquet"
    if not summary_path.is_file() and not requests_path.is_file():
        jobs = sorted(p.parent for p in d.glob("*/**/summary.json"))
        if jobs:
            raise ExportError(f"{d} holds {len(jobs)} run directories (a sweep); export one of them, "
                              f"e.g. {jobs[0]}")
        raise ExportError(f"{d}: not a run directory (no summary.json, no requests.parquet)")
    for p in (summary_path, requests_path):
        if not p.is_file():
            raise ExportError(f"{d}: no {p.name} (the run failed before writing it, or it was removed)")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{summary_path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
        raise ExportError(f"{summary_path}: not a testbed run summary (no 'config')")
    try:
        requests = pd.read_parquet(requests_path)
    except Exception as e:  # pyarrow raises several types for truncated or foreign files
        raise ExportError(f"{requests_path}: unreadable ({type(e).__name__}: {e})") from None
    missing = {"rid", "state", "arrival_s", "ttft_s", "tpot_s", "e2e_s", "token_times_s"} - set(requests.columns)
    if missing:
        raise ExportError(f"{requests_path}: not a testbed requests file (no {', '.join(sorted(missing))})")
    if summary.get("started_at"):
        started = datetime.datetime.fromisoformat(summary["started_at"])
        source = "summary.json started_at"
    else:  # written before summary.json had started_at: the wall clock is unknown (a file's mtime
        # may be a checkout's), so the times count from the Unix epoch and say so
        started = EPOCH
        source = "unknown (the run predates summary.json's started_at): times count from the Unix epoch"
    return RunData(d, summary, requests.sort_values("rid").reset_index(drop=True), started, source)
