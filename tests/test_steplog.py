"""The step log (testbed.timeline.steplog) takes a row whole or not at all: a Ctrl-C between two
of its column appends undoes the row, so the columns the writer gets are of one length."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.timeline.schema import STEPS_SCHEMA
from testbed.timeline.steplog import STEP_COLUMNS, StepLog


def row(k):
    return {c: (None if c == "predicted_s" else (float(k) if STEPS_SCHEMA.field(c).type == "double" else k))
            for c in STEP_COLUMNS}


class _Interrupt:
    """A value whose conversion raises KeyboardInterrupt: a Ctrl-C landing at its column's append."""

    def __index__(self):
        raise KeyboardInterrupt
    __float__ = __index__


NUMERIC = [c for c in STEP_COLUMNS if c != "predicted_s"]


def lengths(log):
    return {c: len(v) for c, v in log.columns().items()}


@pytest.mark.parametrize("at", NUMERIC)
def test_a_signal_mid_append_leaves_the_row_out(at):
    log = StepLog()
    log.append(**row(0))
    with pytest.raises(KeyboardInterrupt):
        log.append(**{**row(1), at: _Interrupt()})
    assert set(lengths(log).values()) == {1}
    log.append(**row(2))
    assert log.table().column("step").to_pylist() == [0, 2]


@pytest.mark.parametrize("at", NUMERIC)
def test_a_signal_mid_extend_leaves_its_rows_out(at):
    log = StepLog()
    log.append(**row(0))
    many = {c: ([None] * 3 if c == "predicted_s" else np.arange(1, 4)) for c in STEP_COLUMNS}
    with pytest.raises(KeyboardInterrupt):
        log.extend(**{**many, at: [1, 2, _Interrupt()]})
    assert set(lengths(log).values()) == {1}
    log.extend(**many)
    assert log.table().column("step").to_pylist() == [0, 1, 2, 3]
