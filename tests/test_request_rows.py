"""requests.parquet built column by column (testbed.timeline.request_rows) against the
row-per-dict table it replaced: the same values, nulls and rid order, for the scheduler's
ledger and a client's records."""
from __future__ import annotations

import pyarrow as pa
import pytest

from scheduler_harness import req
from testbed.client.record import ClientRecord, client_row
from testbed.core import RequestState
from testbed.timeline.records import request_row
from testbed.timeline.request_rows import RequestRows
from testbed.timeline.schema import REQUESTS_SCHEMA


def ledger(rid, tokens, chunks=((0.5, 4),)):
    r = req(rid, 8, max(tokens, 1))
    r.state, r.finish_reason = RequestState.FINISHED, "length"
    r.first_scheduled = chunks[0][0] if chunks else None
    r.chunk_times.extend(chunks)
    r.output_ids.extend(range(100, 100 + tokens))
    r.token_times.extend(1.0 + 0.1 * k for k in range(tokens))
    r.first_token = r.token_times[0] if tokens else None
    r.finish_time = r.token_times[-1] if tokens else None
    return r


def by_dicts(reqs, keep, row=request_row):
    """The table as it was made before: one dict per request, in rid order."""
    return pa.Table.from_pylist([row(r, keep) for r in sorted(reqs, key=lambda r: r.rid)], schema=REQUESTS_SCHEMA)


@pytest.mark.parametrize("keep", [False, True])
def test_rows_added_in_any_order_make_the_table_of_one_dict_per_request(keep):
    reqs = [ledger(3, 5), ledger(0, 1), ledger(2, 0, chunks=()), ledger(1, 7, chunks=((0.1, 3), (0.2, 5)))]
    rows = RequestRows(keep)
    for r in reqs:  # the order they ended in, not rid order
        rows.add(r)
    t = rows.table()
    assert t.equals(by_dicts(reqs, keep))
    assert t.column("rid").to_pylist() == [0, 1, 2, 3]
    assert t.column("output_ids").null_count == (0 if keep else 4)


def test_a_clients_null_list_columns_stay_null():
    recs = [ClientRecord(1, 10, 4, 0.5, 0), ClientRecord(0, 12, 3, 0.0, 0)]
    recs[0].token_times.extend([1.0, 1.5])
    rows = RequestRows(False, client_row)
    for r in recs:
        rows.add(r)
    t = rows.table()
    assert t.equals(by_dicts(recs, False, client_row))
    assert t.column("chunk_times_s").null_count == 2 and t.column("token_times_s").null_count == 0


def test_no_rows_is_an_empty_table_of_the_schema():
    t = RequestRows(False).table()
    assert t.num_rows == 0 and t.schema == REQUESTS_SCHEMA


def test_a_request_added_twice_is_refused():
    rows = RequestRows(False)
    rows.add(ledger(0, 2))
    with pytest.raises(ValueError, match="request 0 added to requests.parquet twice"):
        rows.add(ledger(0, 2))


def test_rows_are_handed_over_once():
    rows = RequestRows(False)
    rows.add(ledger(0, 2))
    rows.table()
    with pytest.raises(RuntimeError, match="handed over"):
        rows.table()
    with pytest.raises(RuntimeError, match="handed over"):
        rows.add(ledger(1, 2))


@pytest.mark.parametrize("row_group_bytes", [1, 1 << 22])
def test_the_writer_takes_rows_in_rid_order_a_row_group_at_a_time(tmp_path, monkeypatch, row_group_bytes):
    """requests.parquet from rows in the order their requests ended, written a row group at a
    time (a row each, or all in one): the table of one dict per request, in rid order."""
    import pyarrow.parquet as pq

    import testbed.timeline.writer as writer
    monkeypatch.setattr(writer, "ROW_GROUP_BYTES", row_group_bytes)
    reqs = [ledger(rid, tokens) for rid, tokens in ((5, 3), (2, 9), (0, 1), (4, 0), (1, 6), (3, 2))]
    rows = RequestRows(True)
    for r in reqs:
        rows.add(r)
    cols, order = rows.gathered()
    assert order is not None
    writer.write_parquet_in_order(cols, order, REQUESTS_SCHEMA, tmp_path / "r.parquet")
    f = pq.ParquetFile(tmp_path / "r.parquet")
    assert f.read().equals(by_dicts(reqs, True))
    assert f.metadata.num_row_groups == (6 if row_group_bytes == 1 else 1)


class _InterruptAt(dict):
    """A row that raises KeyboardInterrupt (a Ctrl-C landing there) when its `at`-th column is read."""

    def __init__(self, d, at):
        super().__init__(d)
        self.at, self.reads = at, 0

    def __getitem__(self, c):
        self.reads += 1
        if self.reads == self.at:
            raise KeyboardInterrupt
        return super().__getitem__(c)


@pytest.mark.parametrize("at", range(2, len(REQUESTS_SCHEMA) + 2))
def test_a_signal_mid_row_leaves_the_row_out_whole(at):
    """A Ctrl-C between two of a row's column appends (the CI failure: a list column one row
    short, the writer's take() out of bounds) undoes the row: the table is of the whole rows,
    and the request can be added again (the run writes it from the ledger)."""
    reqs = [ledger(0, 3), ledger(1, 4, chunks=((0.1, 3), (0.2, 5))), ledger(2, 2)]
    hits = {"n": 0}

    def row(r, keep):
        d = request_row(r, keep)
        if r.rid != 1:
            return d
        hits["n"] += 1
        return _InterruptAt(d, at) if hits["n"] == 1 else d
    rows = RequestRows(True, row)
    rows.add(reqs[0])
    with pytest.raises(KeyboardInterrupt):
        rows.add(reqs[1])
    assert rows.rids == {0}
    rows.add(reqs[2])
    rows.add(reqs[1])  # again, whole
    assert rows.table().equals(by_dicts(reqs, True))
