"""Collect a run's steps and requests and write requests.parquet, steps.parquet and
summary.json (each written to a temporary name, then renamed: a file is whole or absent)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from testbed.timeline import metrics as metric_columns
from testbed.timeline.arrow_build import Column, table
from testbed.timeline.metrics import summarize
from testbed.timeline.records import request_row
from testbed.timeline.request_rows import RequestRows
from testbed.timeline.schema import REQUESTS_SCHEMA, STEPS_SCHEMA
from testbed.timeline.steplog import StepLog


def requests_table(reqs, keep_output_ids: bool, row=request_row, rows: RequestRows | None = None) -> pa.Table:
    """row: a request's row (request_row for the scheduler's ledger, testbed.client's client_row);
    rows: rows gathered already (a replay's streamed ones), the requests `reqs` added to them."""
    return table(_request_columns(reqs, keep_output_ids, row, rows), REQUESTS_SCHEMA)


def _request_columns(reqs, keep_output_ids: bool, row, rows: RequestRows | None) -> dict[str, Column]:
    return _gathered(reqs, keep_output_ids, row, rows).columns()


def _gathered(reqs, keep_output_ids: bool, row, rows: RequestRows | None) -> RequestRows:
    rows = rows if rows is not None else RequestRows(keep_output_ids, row)
    for r in reqs:
        rows.add(r)
    return rows


def git_revision() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (rev + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    """The versions of the libraries the run loaded, and pandas' always (the files are read
    with it; a simulator run writes them without loading it)."""
    out = {"python": platform.python_version()}
    for mod in ("numpy", "pandas", "pyarrow", "simpy", "hydra", "torch", "transformers", "flashinfer"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
        elif mod == "pandas":
            out[mod] = importlib.metadata.version("pandas")
    return out


ROW_GROUP_BYTES = 4 << 20  # the writer buffers a row group's pages: a run's files are written in pieces


def write_parquet(t: pa.Table, path) -> None:
    """zstd, dictionary-encoding the string columns only (a run's numbers, token and step times,
    are nearly all distinct: hashing them for a dictionary the writer then drops took 3x the
    write's time, for a bigger file), in row groups of about ROW_GROUP_BYTES."""
    pq.write_table(t, path, row_group_size=max(1, ROW_GROUP_BYTES * t.num_rows // max(t.nbytes, 1)),
                   **_options(t.schema))


def write_parquet_in_order(cols: dict[str, Column], order: np.ndarray | None, schema: pa.Schema, path) -> None:
    """write_parquet of the columns' rows taken in `order` (None: as they are), a row group at a
    time: only a row group's rows are ever copied into order."""
    if order is None:
        return write_parquet(table(cols, schema), path)
    size = sum(c.values.nbytes if isinstance(c.values, np.ndarray) else 8 * len(c.values) for c in cols.values())
    step = max(1, ROW_GROUP_BYTES * len(order) // max(size, 1))
    with pq.ParquetWriter(path, schema, **_options(schema)) as w:
        for a in range(0, len(order), step):
            w.write_table(table({name: c.take(order[a:a + step]) for name, c in cols.items()}, schema))


def _options(schema: pa.Schema) -> dict:
    """Both writers' settings (write_parquet's docstring says why)."""
    return {"compression": "zstd", "use_dictionary": [f.name for f in schema if pa.types.is_string(f.type)]}


class WriteError(RuntimeError):
    """Some of a run's files could not be written (a full disk, a read-only directory); the
    others were, and the summary dict still has every metric."""


def write_run(out_dir: str | os.PathLike, reqs, steps: StepLog, config: dict, extra: dict,
              keep_output_ids: bool, slo=None, row=request_row, rows: RequestRows | None = None) -> dict:
    """Write the three files; returns the summary dict. A file that cannot be written is left
    out (no partial file: each is written to a temporary name and renamed) and the others are
    still written; then WriteError names it and why, with the summary dict as `.summary`.
    slo: the run's SLOConfig (goodput and SLO attainment), or None. row, rows: as requests_table's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the rows as they were added (a replay's: as its requests ended), written in rid order a
    # row group at a time; the metrics do not depend on the rows' order
    req, order = _gathered(reqs, keep_output_ids, row, rows).gathered()
    step = steps.columns()
    st = table(step, STEPS_SCHEMA)
    failed: dict[str, str] = {}  # file -> why it could not be written

    def attempt(name, write):
        tmp = out / f"{name}.tmp"
        try:
            write(tmp)
            os.replace(tmp, out / name)
        except OSError as e:
            failed[name] = str(e.strerror or e)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
    attempt("requests.parquet", lambda t: write_parquet_in_order(req, order, REQUESTS_SCHEMA, t))
    attempt("steps.parquet", lambda t: write_parquet(st, t))
    slos = (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms) if slo is not None else ()
    times = req["token_times_s"]  # the token times stay flat: values and offsets
    metrics = summarize({c: req[c].numpy() for c in metric_columns.REQUEST_COLUMNS if c != "token_times_s"},
                        {c: step[c].numpy() for c in metric_columns.STEP_COLUMNS}, *slos,
                        token_times=(times.values, times.offsets),
                        token_times_scratch=True)  # the file has them: the gaps are made over them
    summary = {"metrics": metrics, **extra, "config": config, "versions": versions(), "git_revision": git_revision()}
    if failed:  # the summary says which of its files are missing
        summary["unwritten_files"] = list(failed)
    attempt("summary.json", lambda t: t.write_text(json.dumps(summary, indent=2, default=str)))
    if failed:
        summary["unwritten_files"] = list(failed)  # the summary.json itself too, when that failed
        err = WriteError(f"could not write {'; '.join(f'{n} ({why})' for n, why in failed.items())} in {out}")
        err.summary = summary
        raise err
    return summary
