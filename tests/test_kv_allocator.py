"""Paged KV allocator and page table alone: unit tests and a model-based property test."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.kv import IntegrityError, NoPrefixCache, OutOfPages, PageAllocator, PageTable, check_kv_integrity


def test_alloc_is_deterministic_and_starts_at_page_zero():
    a = PageAllocator(8)
    assert a.alloc(3).tolist() == [0, 1, 2]
    assert a.alloc(2).tolist() == [3, 4]
    assert a.free_pages == 3
    b = PageAllocator(8)
    assert b.alloc(3).tolist() == [0, 1, 2]


def test_free_then_alloc_reuses_pages_and_counts_add_up():
    a = PageAllocator(6)
    p = a.alloc(4)
    a.free(p[1:3])
    assert a.free_pages == 4
    q = a.alloc(4)
    assert sorted(q.tolist()) == [1, 2, 4, 5]
    assert a.free_pages == 0
    with pytest.raises(OutOfPages):
        a.alloc(1)
    a.free(np.zeros(0, np.int64))  # freeing nothing is fine
    assert a.free_pages == 0


def test_alloc_more_than_free_raises_and_changes_nothing():
    a = PageAllocator(4)
    a.alloc(3)
    with pytest.raises(OutOfPages, match="asked for 2 pages, 1 free"):
        a.alloc(2)
    assert a.free_pages == 1
    assert a.alloc(1).tolist() == [3]


def test_freeing_more_than_allocated_is_a_double_free():
    a = PageAllocator(4)
    p = a.alloc(1)
    a.free(p)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(p)


def test_alloc_returns_a_copy_not_a_view():
    a = PageAllocator(4)
    p = a.alloc(2)
    a.free(p)
    p[:] = 99  # the caller scribbling on its array must not corrupt the free stack
    assert sorted(a.free_set().tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_sizes_raise_value_error(bad):
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(bad)
    with pytest.raises(ValueError, match="page_size"):
        PageAllocator(4, page_size=bad)


def test_slots_of_page_size_1_and_4():
    assert PageAllocator(8).slots_of(np.array([3, 1])).tolist() == [3, 1]
    a = PageAllocator(8, page_size=4)
    assert a.slots_of(np.array([2, 0])).tolist() == [8, 9, 10, 11, 0, 1, 2, 3]
    assert a.slots_of(np.zeros(0, np.int64)).tolist() == []


def test_page_table_rows_and_slots():
    t = PageTable(3, 16)
    rows = [t.acquire(), t.acquire(), t.acquire()]
    assert rows == [0, 1, 2]
    assert t.num_free_rows == 0
    with pytest.raises(RuntimeError, match="no free page-table row"):
        t.acquire()
    t.write(1, 4, np.array([7, 8, 9]))
    assert t.read(1, 4, 7).tolist() == [7, 8, 9]
    t.release(1)
    assert t.num_free_rows == 1 and t.acquire() == 1


def test_integrity_check_counts_and_catches_double_booking():
    a = PageAllocator(6)
    cache = NoPrefixCache(1)
    own = a.alloc(4)
    counts = check_kv_integrity(a, cache, [own[:2], own[2:]], [])
    assert counts == {"free": 2, "cached": 0, "in_use": 4, "total": 6}
    # the allocator only checks counts: a page freed twice (while others are out) slips past it ...
    a.free(own[:1])
    a.free(own[:1])
    # ... and the integrity check names it
    with pytest.raises(IntegrityError):
        check_kv_integrity(a, cache, [own[1:2], own[3:]], [])
    with pytest.raises(IntegrityError, match="do not add up"):
        check_kv_integrity(a, cache, [own], [])


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 30), data=st.data())
def test_each_page_once_is_what_the_sort_finds(total, data):
    """The integrity check's mark per page (kv/integrity.py) against sorting the ids: a pool's
    pages held each once, or some twice, negative or past the pool."""
    from testbed.kv.integrity import _each_once
    pages = np.array(data.draw(st.one_of(st.permutations(range(total)),
                                         st.lists(st.integers(-2, total + 2), min_size=total, max_size=total))),
                     np.int64)
    uniq = np.unique(pages)
    assert _each_once(pages, total) == (len(uniq) == total and (not total or (uniq[0] >= 0 and uniq[-1] < total)))


def test_integrity_check_names_a_page_past_the_pool():
    a = PageAllocator(4)
    own = a.alloc(2)
    with pytest.raises(IntegrityError, match="out of range"):
        check_kv_integrity(a, NoPrefixCache(1), [np.array([own[0], 4])], [])
    with pytest.raises(IntegrityError, match=r"two places: \[%d\]" % own[0]):
        check_kv_integrity(a, NoPrefixCache(1), [np.array([own[0], own[0]])], [])


@settings(max_examples=60, deadline=None)
@given(num_pages=st.integers(1, 40), page_size=st.sampled_from([1, 2, 4, 16]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 45), st.randoms(use_true_random=False)), max_size=60))
def test_allocator_against_a_set_model(num_pages, page_size, ops):
    a = PageAllocator(num_pages, page_size)
    out: list[int] = []  # pages handed out, in a list (a model of the caller)
    for is_alloc, n, rnd in ops:
        if is_alloc:
            if n > a.free_pages:
                with pytest.raises(OutOfPages):
                    a.alloc(n)
                continue
            got = a.alloc(n).tolist()
            assert len(got) == n and len(set(got)) == n
            assert not set(got) & set(out), "page handed out twice"
            assert all(0 <= p < num_pages for p in got)
            out.extend(got)
        else:
            k = min(n, len(out))
            rnd.shuffle(out)
            give, out = out[:k], out[k:]
            a.free(np.array(give, dtype=np.int64))
        free = a.free_set().tolist()
        assert a.free_pages == num_pages - len(out) == len(free)
        assert sorted(free + out) == list(range(num_pages))
        slots = a.slots_of(np.array(out, dtype=np.int64))
        assert len(slots) == len(out) * page_size
        if out:
            assert (slots // page_size).tolist() == np.repeat(out, page_size).tolist()


def test_page_table_memory_is_backed_only_where_written():
    """A table of many long rows costs the slots written, not rows x max_len: the lazy zeros
    take no huge pages, so a row's first slot does not make 2 MiB of it resident."""
    import resource

    from testbed.kv.page_table import PageTable

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20
    before = rss_mib()
    pt = PageTable(512, 131072)  # 512 MiB if every row were resident
    for row in range(512):
        pt.write(row, 0, np.arange(16, dtype=np.int64))
    assert pt.read(7, 0, 4).tolist() == [0, 1, 2, 3] and pt.read(7, 16, 20).tolist() == [0, 0, 0, 0]
    assert rss_mib() - before < 64
