"""requests.parquet's rows gathered column by column: a request's row (request_row, or a
client's) is taken when it is added and kept as plain column lists, its list columns
(token times, chunks, output ids) as flat typed arrays with offsets, so a row costs bytes
per token, not Python objects. A replay adds each request when it ends (StepLoop.stream_rows)
and can then drop the request's own per-token lists; the rest are added at the end."""
from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

from testbed.timeline.arrow_build import Column, table
from testbed.timeline.records import request_row
from testbed.timeline.schema import REQUESTS_SCHEMA

_LIST_CODES = {pa.list_(pa.float64()): "d", pa.list_(pa.int64()): "q"}
_NUMPY = {"d": np.float64, "q": np.int64}


class RequestRows:
    def __init__(self, keep_output_ids: bool, row=request_row):
        """row: a request's row dict (request_row for the scheduler's ledger, testbed.client's client_row)."""
        self.keep_output_ids = keep_output_ids
        self.row = row
        self.scalars = {f.name: [] for f in REQUESTS_SCHEMA if f.type not in _LIST_CODES}
        # list column -> (values, offsets, null flags)
        self.lists = {f.name: (array(_LIST_CODES[f.type]), array("q", [0]), [])
                      for f in REQUESTS_SCHEMA if f.type in _LIST_CODES}
        self.rids: set[int] = set()

    def __len__(self) -> int:
        return len(self.rids)

    def add(self, r) -> None:
        if self.scalars is None:
            raise RuntimeError("RequestRows.add() after table(): its rows were handed over")
        d = self.row(r, self.keep_output_ids)
        if d["rid"] in self.rids:
            raise ValueError(f"request {d['rid']} added to requests.parquet twice")
        n = len(self.rids)
        try:
            for c, col in self.scalars.items():
                col.append(d[c])
            for c, (values, offsets, nulls) in self.lists.items():
                v = d[c]
                nulls.append(v is None)
                if v is not None:
                    values.extend(v)
                offsets.append(len(values))
            self.rids.add(d["rid"])
        except BaseException:  # Ctrl-C mid-row: the row is taken whole or not at all
            self._cut(n)
            raise

    def _cut(self, n: int) -> None:
        """Back to the first n rows (a row half added is undone)."""
        for col in self.scalars.values():
            del col[n:]
        for values, offsets, nulls in self.lists.values():
            del offsets[n + 1:]
            del values[offsets[-1]:]
            del nulls[n:]

    def columns(self) -> dict[str, Column]:
        """The rows in rid order, column by column (REQUESTS_SCHEMA's); hands them over (once:
        the columns gathered here are let go)."""
        cols, order = self.gathered()
        return cols if order is None else {name: c.take(order) for name, c in cols.items()}

    def gathered(self) -> tuple[dict[str, Column], np.ndarray | None]:
        """The columns in the order the rows were added, and the order that sorts them by rid
        (None: they are in it already); hands them over as columns() does. For a writer that
        takes the rows in rid order a piece at a time: a replay's rows come in the order its
        requests ended, and a sorted copy of its token times would be a second copy."""
        if self.scalars is None:
            raise RuntimeError("RequestRows: its rows were handed over already (table() or columns())")
        cols = {}
        for f in REQUESTS_SCHEMA:
            if f.name in self.scalars:
                cols[f.name] = Column.of(f.name, self.scalars[f.name], f.type)
            else:
                values, offsets, nulls = self.lists[f.name]
                valid = ~np.array(nulls, bool)
                cols[f.name] = Column(f.type, np.frombuffer(values, _NUMPY[values.typecode]),
                                      None if valid.all() else valid, np.frombuffer(offsets, np.int64))
        order = np.argsort(cols["rid"].values, kind="stable")
        self.scalars = self.lists = None  # handed over
        return cols, (order if len(order) and (np.diff(order) != 1).any() else None)

    def table(self) -> pa.Table:
        """columns() as an Arrow table."""
        return table(self.columns(), REQUESTS_SCHEMA)
