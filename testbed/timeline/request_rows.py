"""requests.parquet's rows gathered column by column: a request's row (request_row, or a
client's) is taken when it is added and kept as plain column lists, its list columns
(token times, chunks, output ids) as flat typed arrays with offsets, so a row costs bytes
per token, not Python objects. A replay adds each request when it ends (StepLoop.stream_rows)
and can then drop the request's own per-token lists; the rest are added at the end."""
from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

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
        self.rids.add(d["rid"])
        for c, col in self.scalars.items():
            col.append(d[c])
        for c, (values, offsets, nulls) in self.lists.items():
            v = d[c]
            nulls.append(v is None)
            if v is not None:
                values.extend(v)
            offsets.append(len(values))

    def table(self) -> pa.Table:
        """The rows in rid order, as REQUESTS_SCHEMA; hands them over (once: the columns
        gathered here are let go)."""
        if self.scalars is None:
            raise RuntimeError("RequestRows.table() was called already: its rows were handed over")
        cols = {}
        for f in REQUESTS_SCHEMA:
            if f.name in self.scalars:
                cols[f.name] = pa.array(self.scalars[f.name], type=f.type)
            else:
                values, offsets, nulls = self.lists[f.name]
                off = pa.array(np.frombuffer(offsets, np.int64).astype(np.int32),
                               mask=np.array(nulls + [False], bool))
                cols[f.name] = pa.ListArray.from_arrays(off, pa.array(np.frombuffer(values, _NUMPY[values.typecode])),
                                                        type=f.type)
        t = pa.table(cols, schema=REQUESTS_SCHEMA)
        order = np.argsort(np.asarray(self.scalars["rid"], np.int64), kind="stable")
        del cols
        self.scalars = self.lists = None  # handed over: a long run's token times are not held twice
        return t.take(order) if len(order) and (np.diff(order) != 1).any() else t
