"""The run's columns built from their buffers (testbed/timeline/arrow_build.py): the Arrow
arrays pa.array makes of the same values and nulls, their numpy view as pandas holds it,
rows reordered as Arrow's take reorders them."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from testbed.timeline.arrow_build import Column

maybe = lambda values: st.lists(st.one_of(st.none(), values), max_size=40)  # noqa: E731
COLUMNS = [(pa.int64(), maybe(st.integers(-2**62, 2**62))),
           (pa.float64(), maybe(st.one_of(st.floats(allow_nan=True), st.integers(-2**40, 2**40)))),
           (pa.string(), maybe(st.text(max_size=8)))]


def same(a: pa.Array, b: pa.Array) -> bool:
    """Equal types, nulls and values, NaN equal to NaN (Array.equals has NaN unequal)."""
    def value(v):
        return ("nan",) if isinstance(v, float) and math.isnan(v) else v
    return a.type == b.type and a.null_count == b.null_count and \
        [value(v) for v in a.to_pylist()] == [value(v) for v in b.to_pylist()]


@pytest.mark.parametrize("type,values", COLUMNS, ids=lambda x: str(x) if isinstance(x, pa.DataType) else "")
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_column_is_what_pa_array_makes_of_its_values(type, values, data):
    items = data.draw(values)
    col = Column.of("c", items, type)
    want = pa.array(items, type=type)
    assert same(col.arrow(), want)
    got, theirs = col.numpy(), want.to_pandas().to_numpy()
    assert len(got) == len(theirs)
    for a, b in zip(got, theirs):  # the same values, nulls where pandas has them (NaN, None)
        assert a == b or (a is None and b is None) or (a != a and b != b) or \
            (a is None and isinstance(b, float) and math.isnan(b))
    order = np.array(data.draw(st.permutations(range(len(items)))), np.int64)
    assert same(col.take(order).arrow(), want.take(pa.array(order)))


@pytest.mark.parametrize("type,values", [(pa.float64(), st.floats(allow_nan=False)), (pa.int64(), st.integers(0, 2**40))],
                         ids=["times", "ids"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_list_column_is_what_pa_array_makes_of_its_rows(type, values, data):
    rows = data.draw(st.lists(st.one_of(st.none(), st.lists(values, max_size=5)), max_size=20))
    lens = [0 if r is None else len(r) for r in rows]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = np.array([v for r in rows if r is not None for v in r], type.to_pandas_dtype())
    valid = np.array([r is not None for r in rows], bool)
    col = Column(pa.list_(type), flat, None if valid.all() else valid, offsets)
    want = pa.array(rows, type=pa.list_(type))
    assert same(col.arrow(), want)
    order = np.array(data.draw(st.permutations(range(len(rows)))), np.int64)
    assert same(col.take(order).arrow(), want.take(pa.array(order)))


def test_values_of_another_kind_are_cast_or_refused_as_pa_array_does():
    assert same(Column.of("rid", [1, 2.5, None], pa.int64()).arrow(), pa.array([1, 2.5, None], type=pa.int64()))
    with pytest.raises(TypeError, match="rid: <U21 values for a column of int64"):
        Column.of("rid", ["a", 1], pa.int64())
    with pytest.raises(pa.ArrowInvalid):
        pa.array(["a", 1], type=pa.int64())
