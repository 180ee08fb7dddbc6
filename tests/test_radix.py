"""Radix prefix cache alone: matching, insertion, splitting, locking, the exact eviction
order of every eviction policy, page alignment, and a model-based property test."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from policies import EVICTIONS, eviction_key
from testbed.kv import NoPrefixCache, RadixCache, make_prefix_cache


def ids(*tokens) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def run(start, n) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def pages(start, n) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def cache(page_size=1, eviction="lru") -> RadixCache:
    return RadixCache(page_size, eviction_key(eviction))


# ---- lookup and insertion ------------------------------------------------------------------
def test_empty_tree_matches_nothing():
    c = cache()
    assert c.peek(run(0, 10)) == 0
    assert c.peek(None) == 0
    node, n, p = c.match(run(0, 10))
    assert node is c.root and n == 0 and len(p) == 0
    assert c.cached_pages == c.evictable_pages == 0
    assert len(c.all_pages()) == 0


def test_insert_then_match_returns_the_inserted_pages():
    c = cache()
    assert c.insert(run(0, 6), pages(100, 6)) == 0  # nothing held before
    assert c.cached_pages == c.evictable_pages == 6
    assert c.peek(run(0, 6)) == 6
    assert c.peek(run(0, 4)) == 4
    assert c.peek(np.concatenate([run(0, 3), ids(99, 98)])) == 3
    node, n, p = c.match(run(0, 8))  # longer than anything cached
    assert n == 6 and p.tolist() == list(range(100, 106))
    c.check()


def test_insert_returns_tokens_already_held_and_takes_only_the_rest():
    c = cache()
    c.insert(run(0, 4), pages(0, 4))
    # same first 4 tokens, then 3 new: the tree keeps its own 4 pages and takes the last 3
    held = c.insert(run(0, 7), pages(10, 7))
    assert held == 4
    assert sorted(c.all_pages().tolist()) == [0, 1, 2, 3, 14, 15, 16]
    assert c.match(run(0, 7))[2].tolist() == [0, 1, 2, 3, 14, 15, 16]
    # an exact duplicate: everything already held, nothing taken
    assert c.insert(run(0, 7), pages(50, 7)) == 7
    assert c.cached_pages == 7
    c.check()


def test_divergence_mid_edge_splits_and_both_branches_match():
    c = cache()
    c.insert(run(0, 8), pages(0, 8))
    b = np.concatenate([run(0, 5), ids(77, 78, 79)])
    assert c.insert(b, pages(20, 8)) == 5
    assert c.peek(run(0, 8)) == 8 and c.peek(b) == 8
    assert c.match(b)[2].tolist() == [0, 1, 2, 3, 4, 20 + 5, 20 + 6, 20 + 7]
    # three nodes now: the shared 5-token stem and two 3-token branches
    assert sorted(len(n.key) for n in c.nodes()) == [3, 3, 5]
    assert c.cached_pages == 11
    c.check()


def test_match_splits_so_the_returned_node_ends_exactly_at_the_match():
    c = cache()
    c.insert(run(0, 8), pages(0, 8))
    node, n, _ = c.match(np.concatenate([run(0, 3), ids(55)]))
    assert n == 3 and len(node.key) == 3 and node.parent is c.root
    assert [len(ch.key) for ch in node.children.values()] == [5]
    c.check()


def test_peek_changes_nothing():
    c = cache(eviction="lfu")
    c.insert(run(0, 8), pages(0, 8))
    before = [(n.nid, len(n.key), n.hits, n.last_access) for n in c.nodes()]
    tick = c._tick
    assert c.peek(run(0, 3)) == 3
    assert [(n.nid, len(n.key), n.hits, n.last_access) for n in c.nodes()] == before
    assert c._tick == tick


@pytest.mark.parametrize("P", [4, 16])
def test_page_aligned_matching(P):
    c = cache(page_size=P)
    seq = run(0, 3 * P)
    assert c.insert(seq, pages(0, 3)) == 0
    assert c.cached_pages == 3
    # a partial page never matches: only whole pages count
    assert c.peek(seq[:P - 1]) == 0
    assert c.peek(seq[:P]) == P
    assert c.peek(seq[:2 * P + 1]) == 2 * P
    other = seq.copy()
    other[P + 1] = -5  # diverges inside page 1: only page 0 is shared
    assert c.peek(other) == P
    node, n, p = c.match(other)
    assert n == P and p.tolist() == [0]
    # inserting the diverging sequence splits at the page boundary, not at the token
    assert c.insert(other, pages(10, 3)) == P
    assert sorted(c.all_pages().tolist()) == [0, 1, 2, 11, 12]
    assert all(len(n.key) % P == 0 for n in c.nodes())
    c.check()


def test_insert_ignores_ids_beyond_whole_pages():
    c = cache(page_size=4)
    c.insert(run(0, 10), pages(0, 2))  # 10 ids, 2 pages: only 8 tokens go in
    assert c.peek(run(0, 10)) == 8
    assert c.cached_pages == 2


# ---- locking ---------------------------------------------------------------------------------
def test_lock_protects_the_whole_path_and_unlock_restores():
    c = cache()
    c.insert(run(0, 6), pages(0, 6))
    c.insert(np.concatenate([run(0, 3), ids(50, 51)]), pages(10, 5))
    node, n, _ = c.match(run(0, 6))
    assert n == 6
    c.lock(node)
    # locked: the 3-token stem and the 3-token branch; evictable: the other 2-token branch
    assert c.evictable_pages == 2
    got = c.evict(100)  # asks for everything: gets only what is unreferenced
    assert sorted(got.tolist()) == [13, 14]
    assert c.peek(run(0, 6)) == 6
    assert c.cached_pages == 6 and c.evictable_pages == 0
    c.lock(node)  # two references
    c.unlock(node)
    assert c.evictable_pages == 0
    c.unlock(node)
    assert c.evictable_pages == 6
    with pytest.raises(RuntimeError, match="not locked"):
        c.unlock(node)
    c.check()


def test_split_of_a_locked_edge_keeps_the_lock_on_both_halves():
    c = cache()
    c.insert(run(0, 8), pages(0, 8))
    node, _, _ = c.match(run(0, 8))
    c.lock(node)
    c.insert(np.concatenate([run(0, 4), ids(90, 91)]), pages(20, 6))  # splits the locked edge
    c.check()
    assert c.evictable_pages == 2
    assert sorted(c.evict(10).tolist()) == [24, 25]
    c.unlock(node)
    c.check()
    assert c.evictable_pages == 8


def test_evict_takes_whole_leaves_and_interior_nodes_only_after_their_children():
    c = cache()
    c.insert(run(0, 4), pages(0, 4))
    c.insert(np.concatenate([run(0, 2), ids(70, 71, 72)]), pages(10, 5))
    # stem [0,1] (pages 0,1), branches [2,3] (pages 2,3) and [70,71,72] (pages 12..14)
    got = c.evict(1)
    assert sorted(got.tolist()) == [2, 3]  # LRU leaf, all of it, though one page was asked
    got = c.evict(1)
    assert sorted(got.tolist()) == [12, 13, 14]
    got = c.evict(1)
    assert sorted(got.tolist()) == [0, 1]  # the stem became a leaf
    assert c.cached_pages == 0 and c.evicted_pages_total == 7
    assert len(c.evict(1)) == 0
    assert len(c.evict(0)) == 0
    c.check()


# ---- eviction order, one policy at a time ------------------------------------------------------
# Four single-edge sequences A, B, C, D with distinct first tokens and known histories:
#   tick 1 insert A (prio 0) | 2 insert B (prio 5) | 3 match B | 4 insert C (prio 1)
#   5 match A | 6 match A | 7 insert D (prio 0)
# last_access: A 6, B 3, C 4, D 7; hits: A 2, B 1, C 0, D 0; created: A 1, B 2, C 4, D 7
SEQS = {"A": run(100, 3), "B": run(200, 3), "C": run(300, 3), "D": run(400, 3)}
PAGES = {"A": pages(0, 3), "B": pages(3, 3), "C": pages(6, 3), "D": pages(9, 3)}
EXPECTED = {
    "lru": "BCAD",  # least recently used first
    "lfu": "CDBA",  # fewest hits (C 0 before D 0 by recency), then B 1, A 2
    "fifo": "ABCD",  # creation order, whatever the use
    "slru": "BCDA",  # probation (hits < 2) in LRU order B, C, D; then protected A
    "priority": "ADCB",  # lowest priority first (A 0, D 0 by recency; C 1; B 5)
}


def history(c: RadixCache) -> None:
    c.insert(SEQS["A"], PAGES["A"], priority=0)
    c.insert(SEQS["B"], PAGES["B"], priority=5)
    c.match(SEQS["B"])
    c.insert(SEQS["C"], PAGES["C"], priority=1)
    c.match(SEQS["A"])
    c.match(SEQS["A"])
    c.insert(SEQS["D"], PAGES["D"], priority=0)


def eviction_order(c: RadixCache) -> str:
    by_page = {int(p): name for name, ps in PAGES.items() for p in ps}
    order = ""
    while c.cached_pages:
        got = c.evict(1)
        names = {by_page[int(p)] for p in got}
        assert len(names) == 1 and len(got) == 3, "one whole leaf per call"
        order += names.pop()
    return order


def test_every_eviction_policy_is_tested():
    assert set(EXPECTED) == set(EVICTIONS.names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_eviction_order(name):
    c = cache(eviction=name)
    history(c)
    n = {node.key[0]: node for node in c.nodes()}
    assert (n[100].last_access, n[200].last_access, n[300].last_access, n[400].last_access) == (6, 3, 4, 7)
    assert (n[100].hits, n[200].hits, n[300].hits, n[400].hits) == (2, 1, 0, 0)
    assert eviction_order(c) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_eviction_order_skips_locked_leaves(name):
    c = cache(eviction=name)
    history(c)
    first = EXPECTED[name][0]
    node, _, _ = c.match(SEQS[first], count_hit=False)
    c.lock(node)
    # the match touched `first`, which may move it in LRU-like orders; it is locked anyway
    order = ""
    by_page = {int(p): nm for nm, ps in PAGES.items() for p in ps}
    while c.evictable_pages:
        order += by_page[int(c.evict(1)[0])]
    assert first not in order and len(order) == 3
    assert c.peek(SEQS[first]) == 3


def test_priority_eviction_uses_the_highest_priority_of_any_user():
    c = cache(eviction="priority")
    c.insert(run(0, 4), pages(0, 4), priority=0)
    c.insert(run(10, 4), pages(4, 4), priority=0)
    c.match(run(0, 4), priority=3)  # a high-priority request used the first one later
    assert sorted(c.evict(1).tolist()) == [4, 5, 6, 7]


def test_eviction_ties_break_by_creation_order():
    c = cache(eviction="fifo")
    # one insert of a shared stem creates the stem; two branches created at ticks 2 and 3
    c.insert(run(0, 2), pages(0, 2))
    c.insert(np.concatenate([run(0, 2), ids(5)]), pages(10, 3))
    c.insert(np.concatenate([run(0, 2), ids(6)]), pages(20, 3))
    assert c.evict(1).tolist() == [12]
    assert c.evict(1).tolist() == [22]
    assert sorted(c.evict(1).tolist()) == [0, 1]


# ---- the none cache --------------------------------------------------------------------------
def test_none_cache_shares_nothing():
    c = make_prefix_cache("none", 4, None)
    assert isinstance(c, NoPrefixCache) and not c.shares
    assert c.insert(run(0, 8), pages(0, 2)) == 8  # "already held": the caller frees its pages
    assert c.peek(run(0, 8)) == 0
    node, n, p = c.match(run(0, 8))
    assert n == 0 and len(p) == 0
    assert len(c.all_pages()) == 0 and len(c.evict(5)) == 0
    assert c.cached_pages == c.evictable_pages == 0


def test_unknown_cache_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="^cache.name='lru' is unknown; allowed: none, radix$"):
        make_prefix_cache("lru", 1, None)


# ---- model-based property test ----------------------------------------------------------------
# Reference model: the set of cached page-aligned prefixes, each mapped to the page id of its
# last page (the tree is prefix-closed, so this is exactly what it must hold).

def _aligned_prefixes(seq, P):
    return [tuple(seq[:k]) for k in range(P, len(seq) + 1, P)]


class RadixModel:
    def __init__(self, P):
        self.P = P
        self.pages: dict[tuple, int] = {}  # aligned prefix -> page of its last page
        self.locks: list[tuple] = []  # locked prefixes (with multiplicity)

    def peek(self, seq):
        n = 0
        for pre in _aligned_prefixes(seq, self.P):
            if pre not in self.pages:
                break
            n = len(pre)
        return n

    def match_pages(self, seq):
        n = self.peek(seq)
        return [self.pages[tuple(seq[:k])] for k in range(self.P, n + 1, self.P)]

    def locked(self):
        out = set()
        for pre in self.locks:
            out.update(_aligned_prefixes(pre, self.P))
        return out


seq_strategy = st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=24)
op_strategy = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 5), seq_strategy),
    st.tuples(st.just("peek"), st.integers(0, 5), seq_strategy),
    st.tuples(st.just("match"), st.integers(0, 5), seq_strategy),
    st.tuples(st.just("lock"), st.integers(0, 5), seq_strategy),
    st.tuples(st.just("unlock"), st.integers(0, 50), st.just([])),
    st.tuples(st.just("evict"), st.integers(0, 20), st.just([])),
)


@settings(max_examples=150, deadline=None)
@given(P=st.sampled_from([1, 2, 4]), eviction=st.sampled_from(["lru", "lfu", "fifo", "slru", "priority"]),
       stems=st.lists(seq_strategy, min_size=6, max_size=6), ops=st.lists(op_strategy, min_size=10, max_size=60))
def test_radix_against_a_prefix_set_model(P, eviction, stems, ops):
    c = cache(P, eviction)
    m = RadixModel(P)
    locked_nodes = []  # (node, prefix tuple)
    next_page = 0
    for op, k, tail in ops:
        seq = np.asarray(stems[k % len(stems)] + tail, dtype=np.int32)  # a few shared stems: real sharing
        key = tuple(seq.tolist())
        if op == "insert":
            n_pages = len(seq) // P
            given_pages = list(range(next_page, next_page + n_pages))
            next_page += n_pages
            held = c.insert(seq, np.asarray(given_pages, dtype=np.int64), priority=k)
            assert held == m.peek(key[:n_pages * P])
            for i in range(held // P, n_pages):  # the tree takes the pages after `held`
                m.pages[key[:(i + 1) * P]] = given_pages[i]
        elif op == "peek":
            assert c.peek(seq) == m.peek(key)
        elif op == "match":
            node, n, got = c.match(seq)
            assert n == m.peek(key) and got.tolist() == m.match_pages(key)
            assert n == 0 or tuple(node.key.tolist()) == key[n - len(node.key):n]
        elif op == "lock":
            node, n, _ = c.match(seq)
            if n:
                c.lock(node)
                locked_nodes.append((node, key[:n]))
                m.locks.append(key[:n])
        elif op == "unlock":
            if locked_nodes:
                node, pre = locked_nodes.pop(k % len(locked_nodes))
                c.unlock(node)
                m.locks.remove(pre)
        elif op == "evict":
            before = dict(m.pages)
            protected = m.locked()
            evictable = len([p for p in before if p not in protected])
            assert c.evictable_pages == evictable
            got = c.evict(k)
            assert len(got) >= min(k, evictable) or evictable == 0
            assert len(got) == len(set(got.tolist()))
            # rebuild the model from what the tree still matches
            m.pages = {pre: pg for pre, pg in before.items() if c.peek(np.asarray(pre, np.int32)) >= len(pre)}
            gone = {pre: pg for pre, pg in before.items() if pre not in m.pages}
            assert sorted(gone.values()) == sorted(got.tolist()), "freed pages are exactly the ones dropped"
            assert not set(gone) & protected, "a locked prefix was evicted"
            if len(got) and protected:
                event("evicted around a locked path")
            # whole leaves only: what goes is closed under extension (no orphaned suffix)
            for pre in m.pages:
                assert pre[:-P] == () or pre[:-P] in m.pages
        # after every operation: the tree agrees with the model
        c.check()
        assert c.cached_pages == len(m.pages)
        assert sorted(c.all_pages().tolist()) == sorted(m.pages.values())
        protected = m.locked()
        assert c.evictable_pages == len([p for p in m.pages if p not in protected])
        for pre in protected:
            assert pre in m.pages


def test_unhit_takes_back_a_match_even_across_a_split():
    c = RadixCache(1, eviction_key("lfu"))
    seq = np.arange(1, 21, dtype=np.int32)
    c.insert(seq, np.arange(20, dtype=np.int64))
    c.match(seq)  # one real hit on the whole edge
    before = {n.nid: n.hits for n in c.nodes()}
    node, got, _ = c.match(seq[:8])  # splits the edge at 8, counts a hit on the upper part
    assert got == 8
    c.unhit(node)
    after = {n.nid: n.hits for n in c.nodes()}
    assert after[node.nid] == 1  # the upper half keeps the earlier real hit only
    assert all(after[k] == v for k, v in before.items())


# ---- the kept eviction heap against a fresh scan ----------------------------------------------
def scan_order_victim(c: RadixCache):
    """What a fresh scan of the tree evicts first: the evictable leaf of smallest (key, nid)."""
    leaves = [n for n in c.nodes() if not n.children and n.lock_ref == 0]
    return min(leaves, key=lambda n: (c.eviction_key(n), n.nid)) if leaves else None


@pytest.mark.parametrize("name", sorted(EXPECTED))
@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("imMlue"), st.integers(0, 7), st.integers(1, 12)), max_size=60))
def test_each_eviction_takes_the_leaf_a_fresh_scan_would(name, ops):
    # sequences sharing prefixes (splits), matches that lock and unlock or lock nothing, hits taken back
    c = cache(eviction=name)
    locked, next_page = [], 0
    for op, seq, n in ops:
        key = np.concatenate([run(1000 * (seq % 3), 4), run(100 * seq, n)])
        if op == "i":
            got = len(pages(next_page, len(key)))
            had = c.insert(key, pages(next_page, got), priority=seq % 2)
            next_page += got
            assert had <= len(key)
        elif op == "m":
            node, hit, _ = c.match(key[:n])
            if hit:
                c.lock(node)
                locked.append(node)
        elif op == "M":  # a match nothing locks: its path's keys change while evictable
            c.match(key, priority=seq)
        elif op == "l" and locked:
            c.unlock(locked.pop(n % len(locked)))
        elif op == "u" and locked:
            c.unhit(locked[n % len(locked)])
        elif op == "e":
            evict_one_as_a_scan_would(c)
    for node in locked:  # then everything, one leaf at a time
        c.unlock(node)
    while c.cached_pages:
        evict_one_as_a_scan_would(c)


def evict_one_as_a_scan_would(c: RadixCache) -> None:
    want = scan_order_victim(c)
    got = c.evict(1)
    if want is None:
        assert len(got) == 0
    else:
        assert got.tolist() == want.pages.tolist()
    c.check()
