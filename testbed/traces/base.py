"""Record types every trace loader returns, the one error type, the trace names (each loader
registers its own), row labels for errors and where a trace file is (find_file)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from testbed.core.made_on_read import MadeOnRead
from testbed.core.registry import Registry

# <repo>/traces: the bundled data files (testbed/traces/../../traces).
TRACE_DIR = Path(__file__).resolve().parent.parent.parent / "traces"


class TraceError(ValueError):
    """Any problem with a trace file or the trace config; the message is one line."""


# trace.name -> load(TraceConfig) -> Trace. Each name's module registers it and is imported
# when a run looks the name up: the file formats' loaders import pandas, which a run of a
# synthetic or a length-only CSV trace does not need before its first step.
TRACES = Registry("trace.name", error=TraceError, modules={
    **dict.fromkeys(("sharegpt", "arxiv", "bwb"), "testbed.traces.csv_length"),
    **dict.fromkeys(("azure_conv", "azure_code"), "testbed.traces.azure"),
    **dict.fromkeys(("mooncake_conversation", "mooncake_synthetic"), "testbed.traces.mooncake"),
    "synthetic": "testbed.traces.synthetic",
    "file": "testbed.traces.user_file",
})


@dataclass(slots=True)
class TraceRequest:
    rid: int  # 0..n-1 in arrival order after all processing
    arrival_s: float  # seconds from trace start, non-decreasing across the list
    prompt_len: int
    output_len: int  # tokens to generate (>= 1)
    priority: int = 0
    made_ids: np.ndarray | None = None  # prompt_ids once made
    id_source: object = None  # lazy_ids.IdWindows that makes them when first read, or None

    @property
    def prompt_ids(self) -> np.ndarray | None:
        """int32 token ids, len == prompt_len; None for a request the context rejects (rule
        reject): its ids are never made, however long its prompt."""
        self.make_ids()
        return self.made_ids

    @prompt_ids.setter
    def prompt_ids(self, ids: np.ndarray | None) -> None:
        self.made_ids, self.id_source = ids, None

    def make_ids(self) -> None:
        """Take the ids from id_source, if they are not made yet."""
        if self.id_source is not None:
            self.made_ids, self.id_source = self.id_source.ids(self.rid), None


class TraceRequestList(MadeOnRead):
    """A trace's rows as TraceRequests, each made when first read and kept (its ids with it):
    a replay reads a row as its request arrives, so 100,000 rows are not 100,000 objects before
    the first step. The columns are the trace's, in rid order (rid i is row i)."""

    def __init__(self, arrival_s: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray,
                 priority: np.ndarray, runs: np.ndarray, source):
        super().__init__(len(arrival_s))
        self.arrival_s = arrival_s  # float64 seconds; read whole by the replay (testbed.assemble)
        self._cols = (arrival_s.tolist(), prompt_len.tolist(), output_len.tolist(), priority.tolist(), runs.tolist())
        self._source = source  # lazy_ids.IdWindows: makes a row's ids when first read

    def _make(self, i: int) -> TraceRequest:
        a, pl, o, q, ok = (c[i] for c in self._cols)
        return TraceRequest(rid=i, arrival_s=a, prompt_len=pl, output_len=o, priority=q,
                            id_source=self._source if ok else None)


@dataclass
class Trace:
    name: str
    requests: Sequence[TraceRequest]  # a list, or a loader's TraceRequestList
    # {"rule": "reject"|"truncate", "count": int, "rids": [...], "max_context": int|None}
    over_context: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # facts worth logging
    rows: int = 0  # rows the source had (after its own filtering); len(requests) of them were taken
    synthesized_arrivals: bool = False  # arrivals drawn at trace.rate (else the trace's own times)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)

    @property
    def rows_left_out(self) -> int:
        return max(self.rows - len(self.requests), 0)


@dataclass(frozen=True)
class Source:
    """Where rows come from, so an error can name the file and the row as a user counts it.

    kind: "csv" (data row r is file line r + 1, the header is line 1), "jsonl" (the file
    line is kept per row, blank lines skipped), "json" (a JSON array: the line where each
    row's entry starts), "parquet" (row r, 1-based), or "synthetic".
    """

    path: str
    kind: str
    lines: tuple[int, ...] | None = None  # jsonl, json: file line of each data row
    kept: tuple[int, ...] | None = None  # rows of a format that leaves some out: their rows in the file

    def subset(self, index) -> "Source":
        """The same file, for the rows `index` of it: row i of the subset is labelled as file row index[i]."""
        return replace(self, kept=tuple(int(i) for i in index))

    def row(self, i: int) -> str:
        """Label of the 0-based data row i."""
        if self.kept is not None:
            i = self.kept[i]
        if self.kind == "csv":
            return f"data row {i + 1} (line {i + 2} counting the header)"
        if self.kind in ("jsonl", "json"):
            line = self.lines[i] if self.lines is not None else i + 1
            return f"line {line}"
        if self.kind == "parquet":
            return f"row {i + 1} (1-based)"
        return f"request {i}"

    def error(self, i: int | None, column: str | None, what: str) -> TraceError:
        parts = [self.path]
        if i is not None:
            parts.append(self.row(i))
        if column is not None:
            parts.append(f"column '{column}'")
        return TraceError(": ".join([", ".join(parts), what]))


def find_file(path: str | None, default_name: str | None, what: str) -> Path:
    """The trace file: `path` if given, else the bundled `default_name` in <repo>/traces."""
    if path is None:
        if default_name is None:
            raise TraceError(f"trace config: {what} needs path= (a CSV, JSONL or Parquet file)")
        p = TRACE_DIR / default_name
    else:
        p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        raise TraceError(f"trace file {p} is a folder; give a file in it (a CSV, JSONL, JSON or Parquet file)")
    folder = p.parent
    if folder.is_dir():
        names = sorted(x.name for x in folder.iterdir() if x.is_file())
        listing = ", ".join(names) if names else "no files"
        raise TraceError(f"trace file not found: {p} (files in {folder}: {listing})")
    raise TraceError(f"trace file not found: {p} (folder {folder} does not exist either)")
