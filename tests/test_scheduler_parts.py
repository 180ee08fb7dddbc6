"""The scheduler's parts on their own: page-table rows, the cache manager, fitting a plan
(prefill.py) and the running requests' ledger (decode.py). The whole scheduler is tested in
test_scheduler.py and test_scheduler_properties.py."""
from __future__ import annotations

import numpy as np
import pytest

from policies import eviction_key
from scheduler_harness import make_scheduler, req, step
from testbed.core import BatchPlan, RequestState, StepResult
from testbed.kv import PageAllocator, RadixCache, check_kv_integrity
from testbed.scheduler.cache_manager import CacheManager
from testbed.scheduler.decode import DecodeManager
from testbed.scheduler.rows import RowManager


def kv_parts(P=1, num_pages=64, rows=4):
    rm = RowManager(rows, 256, P)
    kv = CacheManager(RadixCache(P, eviction_key("lru")), PageAllocator(num_pages, P), rm)
    return rm, kv


def computed(rm, kv, r, n):
    """r admitted with n tokens of KV computed on fresh pages (what a prefill leaves)."""
    rm.acquire(r)
    kv.match(r)
    r.cached_len = r.shared_len
    r.num_pages = r.shared_len // rm.page_size
    needs, held = rm.page_needs([r], [n - r.cached_len])
    pages, _ = kv.alloc(sum(needs))
    rm.map_new_pages([r], needs, held, pages)
    r.cached_len = n


def no_pages_lost(kv, live):
    return check_kv_integrity(kv.allocator, kv.cache, [kv.own_pages(r) for r in live],
                              [kv.shared_pages(r) for r in live])


# ---- rows ----------------------------------------------------------------------------------------
def test_rows_are_owned_while_held_and_reused_after_release():
    rm = RowManager(2, 100, 1)
    a, b = req(0, 4, 2), req(1, 4, 2)
    rm.acquire(a), rm.acquire(b)
    assert rm.num_free == 0 and rm.owners[a.row] is a and rm.owners[b.row] is b
    row = a.row
    rm.release(a)
    assert a.row == -1 and rm.owners[row] is None and rm.num_free == 1
    rm.acquire(a)
    assert a.row == row


@pytest.mark.parametrize("P", [1, 4])
def test_page_needs_and_one_scatter_write_each_items_new_pages_after_its_old_ones(P):
    rm = RowManager(3, 64, P)
    a, b, c = req(0, 10, 5), req(1, 10, 5), req(2, 10, 5)
    for r in (a, b, c):
        rm.acquire(r)
    a.cached_len, a.num_pages = 2 * P, 2  # two full pages; 1 more token needs a third
    b.cached_len, b.num_pages = 1, 1  # room left on its page (if P > 1)
    needs, held = rm.page_needs([a, b, c], [1, P - 1 if P > 1 else 1, 2 * P + 1])
    assert held == [2, 1, 0]
    assert needs == [1, 0 if P > 1 else 1, 3]
    pages = np.arange(100, 100 + sum(needs), dtype=np.int64)
    rm.map_new_pages([a, b, c], needs, held, pages)
    assert (a.num_pages, b.num_pages, c.num_pages) == (3, 1 if P > 1 else 2, 3)
    assert rm.pages(a, 2 * P, 3 * P).tolist() == [100]
    assert rm.pages(c, 0, 3 * P).tolist() == pages[-3:].tolist()
    assert rm.page_table.read(c.row, 0, P).tolist() == [pages[-3] * P + o for o in range(P)]


@pytest.mark.parametrize("P", [1, 4])
def test_one_new_page_per_item_lands_after_each_items_old_pages(P):
    # a decode step's shape: every item needs exactly one page (the scatter without expansion)
    rm = RowManager(3, 64, P)
    rs = [req(i, 10, 5) for i in range(3)]
    for i, r in enumerate(rs):
        rm.acquire(r)
        r.cached_len, r.num_pages = i * P, i  # full pages: the next token needs a new one
    needs, held = rm.page_needs(rs, [1, 1, 1])
    assert needs == [1, 1, 1]
    rm.map_new_pages(rs, needs, held, np.array([7, 8, 9], np.int64))
    assert [r.num_pages for r in rs] == [1, 2, 3]
    assert [rm.pages(r, i * P, (i + 1) * P).tolist() for i, r in enumerate(rs)] == [[7], [8], [9]]
    assert rm.page_table.read(rs[2].row, 2 * P, 3 * P).tolist() == [9 * P + o for o in range(P)]


# ---- the cache manager ----------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 4])
def test_release_shares_the_computed_aligned_prefix_and_frees_the_rest(P):
    rm, kv = kv_parts(P)
    a = req(0, 10, 5)
    computed(rm, kv, a, 10)
    kv.release(a)
    assert (a.row, a.num_pages, a.shared_len, a.cache_node) == (-1, 0, 0, None)
    assert kv.cache.peek(a.prompt_ids) == 10 // P * P
    counts = no_pages_lost(kv, [])
    assert counts["cached"] == 10 // P and counts["in_use"] == 0


def test_match_locks_and_maps_the_prefix_and_unmatch_takes_it_back():
    rm, kv = kv_parts()
    a = req(0, 10, 5)
    computed(rm, kv, a, 10)
    kv.release(a)
    b = req(1, 12, 5, ids=np.concatenate([a.prompt_ids, [1, 2]]).astype(np.int32))
    rm.acquire(b)
    hits = [n.hits for n in kv.cache.nodes()]
    assert kv.match(b) == 10 and b.shared_len == 10
    assert kv.cache.evictable_pages == 0 and b.cache_node.lock_ref == 1
    assert rm.pages(b, 0, 10).tolist() == kv.cache.all_pages().tolist()
    kv.unmatch(b)
    assert b.cache_node is None and b.shared_len == 0 and kv.cache.evictable_pages == 10
    assert [n.hits for n in kv.cache.nodes()] == hits


def test_share_prefill_moves_the_row_onto_the_trees_pages_and_frees_the_duplicates():
    rm, kv = kv_parts()
    a, b = req(0, 8, 5), req(1, 8, 5)
    b.prompt_ids = a.prompt_ids.copy()
    computed(rm, kv, a, 8)
    computed(rm, kv, b, 8)  # computed the same prompt alongside a, on its own pages
    kv.share_prefill(a)
    kv.share_prefill(b)  # the tree has a's pages already: b's copies go back
    assert a.shared_len == b.shared_len == 8 and a.cache_node is b.cache_node
    assert rm.pages(a, 0, 8).tolist() == rm.pages(b, 0, 8).tolist()
    assert kv.allocator.free_pages == 64 - 8
    no_pages_lost(kv, [a, b])
    kv.release(a), kv.release(b)
    assert kv.cache.evictable_pages == 8 and no_pages_lost(kv, [])["in_use"] == 0


def test_alloc_evicts_only_what_the_free_pages_lack():
    rm, kv = kv_parts(num_pages=16)
    a = req(0, 10, 5)
    computed(rm, kv, a, 10)
    kv.release(a)
    assert kv.available_pages == 16
    pages, evicted = kv.alloc(6)
    assert evicted == 0 and kv.allocator.free_pages == 0
    kv.allocator.free(pages)
    _, evicted = kv.alloc(8)  # 2 short: the one unreferenced leaf (10 pages) goes
    assert evicted == 10 and kv.allocator.free_pages == 6 + 10 - 8


# ---- fitting a plan ------------------------------------------------------------------------------
def test_enqueue_keeps_arrival_then_id_order():
    s = make_scheduler()
    for rid, t in [(3, 0.2), (1, 0.1), (2, 0.2), (0, 0.3)]:
        s.add_request(req(rid, 4, 2, arrival=t), t)
    assert [r.rid for r in s.waiting] == [1, 2, 3, 0] and all(r.queued for r in s.waiting)


def test_fit_drops_this_steps_admissions_from_the_end_before_preempting():
    s = make_scheduler("chunked", num_pages=24, max_running=4)
    a = req(0, 8, 10)
    s.add_request(a, 0.0)
    step(s)
    b, c = req(1, 8, 4), req(2, 8, 4)
    s.add_request(b, 0.0), s.add_request(c, 0.0)
    plan = BatchPlan()
    plan.add(a, 1), plan.add(b, 8), plan.add(c, 8)  # 1 + 8 + 8 pages; 16 free, none evictable
    assert s.prefill.fit(plan, s.view(0.0), 0.0) == (1, 1, 0, 0)  # admitted, dropped, preempted, evicted
    assert plan.reqs == [a, b] and c.queued and c.row == -1 and c.state == RequestState.WAITING
    assert a.state == b.state == RequestState.RUNNING and b.num_pages == 8


def test_fit_drops_what_finds_no_row():
    s = make_scheduler("chunked", max_running=1)
    a, b = req(0, 4, 4), req(1, 4, 4)
    s.add_request(a, 0.0), s.add_request(b, 0.0)
    plan = BatchPlan()
    plan.add(a, 4), plan.add(b, 4)
    assert s.prefill.fit(plan, s.view(0.0), 0.0) == (1, 1, 0, 0)
    assert plan.reqs == [a] and b.queued


# ---- the running requests' ledger ------------------------------------------------------------------
def test_advance_samples_only_items_that_reach_their_known_tokens():
    dm = DecodeManager([], [], kv=None)
    chunk, last, dec = req(0, 10, 3), req(1, 10, 3), req(2, 10, 3)
    last.cached_len = 6
    dec.cached_len, dec.device_len = 10, 11
    dec.output_ids.append(7)  # its first token, delivered
    plan = BatchPlan()
    plan.add(chunk, 4), plan.add(last, 4), plan.add(dec, 1)
    assert dm.advance(plan, 1.0) == (1, 2, 8)  # decodes, prefill items, prefill tokens
    assert plan.samples.tolist() == [False, True, True] and plan.cached_lens.tolist() == [0, 6, 10]
    assert (chunk.cached_len, last.device_len, dec.device_len) == (4, 11, 12)
    assert [r.pending_tokens for r in (chunk, last, dec)] == [0, 1, 1]
    assert plan.watch == [0, 1]  # the prefill items; the decode is neither its last token nor EOS-checked
    assert chunk.chunk_times == [(1.0, 4)] and dec.chunk_times == [] and all(r.inflight == 1 for r in plan.reqs)


def test_an_end_while_a_step_is_in_flight_waits_for_it_to_release():
    s = make_scheduler("chunked")
    a = req(0, 6, 5)
    s.add_request(a, 0.0)
    plan = s.schedule(0.0)
    s.running.remove(a)
    s.decode.end(a, RequestState.ABORTED, "abort", 0.001)
    assert s.decode.ending == [a] and a.row >= 0 and s.live_requests() == [a]
    s.complete(plan, StepResult(0.01, np.array([1])), 0.01)
    assert s.decode.ending == [] and a.row == -1 and s.done == [a]
