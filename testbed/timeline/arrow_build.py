"""A run's columns as Arrow arrays built from their buffers (numpy data, a validity bitmap,
offsets), and as numpy arrays for the metrics. pyarrow's own conversions (pa.array,
to_numpy) import pandas, to look for pandas objects: 0.2 s of a simulator run, and 0.05 s
more at its exit, that nothing else of the run needs. The arrays hold the values and nulls
pa.array makes of the same lists (tests/test_arrow_build.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_NUMPY = {pa.int64(): np.int64, pa.int32(): np.int32, pa.float64(): np.float64}


@dataclass
class Column:
    """One column: numbers (values and validity), strings (a list, None for null), or lists
    (row i is the flat values[offsets[i]:offsets[i + 1]], a null row where not valid)."""
    type: pa.DataType
    values: np.ndarray | list
    valid: np.ndarray | None = None  # None: no nulls
    offsets: np.ndarray | None = None  # list columns: int64, one more than the rows

    @classmethod
    def of(cls, name: str, items: list, type: pa.DataType) -> "Column":
        """A numeric or string column from a list of Python values (None: null)."""
        if pa.types.is_string(type):
            return cls(type, items)
        valid = np.fromiter((v is not None for v in items), bool, len(items))
        values = np.array([0 if v is None else v for v in items]) if items else np.zeros(0, _NUMPY[type])
        if values.dtype.kind not in "iuf":  # pa.array refuses them too (it casts a float to an integer, as here)
            raise TypeError(f"{name}: {values.dtype} values for a column of {type}")
        return cls(type, values.astype(_NUMPY[type], copy=False), None if valid.all() else valid)

    def __len__(self) -> int:
        return len(self.values) if self.offsets is None else len(self.offsets) - 1

    def take(self, order: np.ndarray) -> "Column":
        """The rows in `order`."""
        valid = None if self.valid is None else self.valid[order]
        if self.offsets is not None:  # the rows' slices, joined (an index per value would be 8 bytes a token)
            starts, ends = self.offsets[:-1][order], self.offsets[1:][order]
            offsets = np.zeros(len(order) + 1, np.int64)
            np.cumsum(ends - starts, out=offsets[1:])
            values = self.values
            flat = np.concatenate([values[a:b] for a, b in zip(starts.tolist(), ends.tolist())]) if len(order) \
                else values[:0]
            return Column(self.type, flat, valid, offsets)
        if isinstance(self.values, list):
            return Column(self.type, [self.values[i] for i in order], valid)
        return Column(self.type, self.values[order], valid)

    def arrow(self) -> pa.Array:
        n = len(self)
        bitmap = None if self.valid is None else pa.py_buffer(np.packbits(self.valid, bitorder="little"))
        if self.offsets is not None:
            values = Column(self.type.value_type, self.values).arrow()
            offsets = pa.py_buffer(self.offsets.astype(np.int32))
            return pa.Array.from_buffers(self.type, n, [bitmap, offsets], children=[values])
        if pa.types.is_string(self.type):
            data = [b"" if v is None else v.encode() for v in self.values]
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(np.fromiter(map(len, data), np.int32, n), out=offsets[1:])
            valid = np.fromiter((v is not None for v in self.values), bool, n)
            bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
            return pa.Array.from_buffers(self.type, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])
        return pa.Array.from_buffers(self.type, n, [bitmap, pa.py_buffer(np.ascontiguousarray(self.values))])

    def numpy(self) -> np.ndarray:
        """As pandas holds the column: nulls as NaN (an integer column with nulls as float),
        strings as objects (None for null). Not for list columns."""
        if isinstance(self.values, list):
            return np.array(self.values, dtype=object)
        if self.valid is None:
            return self.values
        out = self.values.astype(np.float64)
        out[~self.valid] = np.nan
        return out


def table(columns: dict[str, Column], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([columns[f.name].arrow() for f in schema], schema=schema)
