"""The length traces' CSV reader without pandas (testbed/traces/plain_csv.py): the values
pandas' reader gives for every file it takes, and None for every other kind of file, which
the loader then reads with pandas."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.traces import TRACE_DIR, load_trace
from testbed.traces.columns import int_column, read_csv
from testbed.traces.plain_csv import int_columns

NAMES = ("num_prefill_tokens", "num_decode_tokens")


def by_pandas(path):
    df, src = read_csv(path)
    return [int_column(df, src, n, minimum=1)[0] for n in NAMES]


@pytest.mark.parametrize("name", ["sharegpt_8k.csv", "arxiv_summarization.csv", "bwb.csv"])
def test_the_bundled_files_read_as_pandas_reads_them(name):
    got = int_columns(TRACE_DIR / name, NAMES, minimum=1)
    assert got is not None  # plain: read without pandas
    for ours, theirs in zip(got, by_pandas(TRACE_DIR / name)):
        assert ours.dtype == theirs.dtype == np.int64
        assert np.array_equal(ours, theirs)


def test_a_plain_file_in_any_column_order(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(" num_decode_tokens ,x,num_prefill_tokens\n6,a b,5\n0008,,7\n")  # no newline at the end too
    got = int_columns(p, NAMES, minimum=1)
    assert [v.tolist() for v in got] == [[5, 7], [6, 8]]
    assert [v.tolist() for v in got] == [v.tolist() for v in by_pandas(p)]
    p.write_text(p.read_text().rstrip("\n"))
    assert [v.tolist() for v in int_columns(p, NAMES, minimum=1)] == [[5, 7], [6, 8]]


# files pandas reads (or refuses) in its own way: each one is not plain
NOT_PLAIN = {
    "quoted cell": 'num_prefill_tokens,num_decode_tokens\n"5",6\n',
    "CRLF": "num_prefill_tokens,num_decode_tokens\r\n5,6\r\n",
    "byte-order mark": "\ufeffnum_prefill_tokens,num_decode_tokens\n5,6\n",
    "blank line": "num_prefill_tokens,num_decode_tokens\n5,6\n\n7,8\n",
    "short row": "num_prefill_tokens,num_decode_tokens,x\n5,6\n",
    "long row": "num_prefill_tokens,num_decode_tokens\n5,6,7\n",
    "duplicate name": "num_prefill_tokens,num_decode_tokens,num_decode_tokens\n5,6,7\n",
    "missing column": "num_prefill_tokens,decode\n5,6\n",
    "header only": "num_prefill_tokens,num_decode_tokens\n",
    "empty": "",
    "spaces in a cell": "num_prefill_tokens,num_decode_tokens\n5, 6\n",
    "float": "num_prefill_tokens,num_decode_tokens\n5,6.0\n",
    "sign": "num_prefill_tokens,num_decode_tokens\n5,+6\n",
    "empty cell": "num_prefill_tokens,num_decode_tokens\n5,\n",
    "below the minimum": "num_prefill_tokens,num_decode_tokens\n5,0\n",
    "19 digits": "num_prefill_tokens,num_decode_tokens\n5,1000000000000000000\n",
    "non-ASCII digit": "num_prefill_tokens,num_decode_tokens\n5,\u0663\n",
}


@pytest.mark.parametrize("why", sorted(NOT_PLAIN))
def test_other_files_are_not_plain(tmp_path, why):
    p = tmp_path / "t.csv"
    p.write_bytes(NOT_PLAIN[why].encode("utf-8"))
    assert int_columns(p, NAMES, minimum=1) is None


def test_a_file_that_is_not_utf8_is_not_plain(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(b"num_prefill_tokens,num_decode_tokens,x\n5,6,\xff\n")
    assert int_columns(p, NAMES, minimum=1) is None


@pytest.mark.parametrize("why", ["quoted cell", "CRLF", "byte-order mark", "blank line", "float"])
def test_a_file_that_is_not_plain_is_read_by_pandas(tmp_path, why):
    p = tmp_path / "t.csv"
    p.write_bytes(NOT_PLAIN[why].encode("utf-8") + b"9,10\n")
    trace = load_trace({"name": "sharegpt", "path": str(p), "num_requests": 0, "shuffle": False})
    want = by_pandas(p)
    assert [r.prompt_len for r in trace.requests] == want[0].tolist()
    assert [r.output_len for r in trace.requests] == want[1].tolist()
