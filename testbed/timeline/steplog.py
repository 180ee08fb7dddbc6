"""The run's step rows as they are recorded (steps.parquet's columns), apart from the writer so
that a run imports it before its first step without the writer's pyarrow.parquet."""
from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

from testbed.timeline.arrow_build import Column, table
from testbed.timeline.schema import STEPS_SCHEMA

STEP_COLUMNS = [f.name for f in STEPS_SCHEMA]
# a step row's numbers in typed arrays (8 bytes a value, not a Python object and a pointer:
# a long run has millions); predicted_s stays a list: the engine fills it after the run (None until then)
_TYPECODES = {pa.int64(): "q", pa.float64(): "d"}
_NUMPY = {"q": np.int64, "d": np.float64}
NULLABLE_STEP_COLUMNS = {"predicted_s"}


class StepLog:
    """Columnar, append-only: one column per field, so a step costs one append each."""

    def __init__(self):
        self.cols = {f.name: [] if f.name in NULLABLE_STEP_COLUMNS else array(_TYPECODES[f.type])
                     for f in STEPS_SCHEMA}
        self._appends = [(c, self.cols[c].append) for c in STEP_COLUMNS]  # bound once, not per step
        self.output_tokens = 0  # sampled so far, for progress reports

    def append(self, **row) -> None:
        n = len(self)
        try:
            for c, append in self._appends:
                append(row[c])
        except BaseException:  # Ctrl-C mid-row: the row is taken whole or not at all
            self._cut(n)
            raise

    def extend(self, **cols) -> None:
        """Many rows at once: each column a numpy array or a sequence of Python numbers, all of
        one length."""
        n = len(self)
        try:
            for c, col in self.cols.items():
                v = cols[c]
                if isinstance(v, np.ndarray) and not isinstance(col, list):
                    col.frombytes(v.astype(_NUMPY[col.typecode], copy=False).tobytes())
                else:
                    col.extend(v)
        except BaseException:  # as append's
            self._cut(n)
            raise

    def _cut(self, n: int) -> None:
        """Back to the first n rows (rows half added are undone)."""
        for col in self.cols.values():
            del col[n:]

    def set_last(self, column: str, value) -> None:
        self.cols[column][-1] = value

    def __len__(self) -> int:
        return len(self.cols["step"])

    def columns(self) -> dict[str, Column]:
        return {f.name: Column.of(f.name, v, f.type) if isinstance(v, list) else
                Column(f.type, np.frombuffer(v, _NUMPY[v.typecode])) for f, v in zip(STEPS_SCHEMA, self.cols.values())}

    def table(self) -> pa.Table:
        return table(self.columns(), STEPS_SCHEMA)
