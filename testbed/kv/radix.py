"""Radix prefix cache over token ids, page aligned.

Each edge holds a run of token ids (a multiple of the page size) and the KV pages that
hold them. Requests lock the node at the end of their matched prefix (a reference count on
the whole path to the root) so nothing they use is evicted; unreferenced leaves are
evicted in the order an eviction policy's key gives (smallest key first); the key reads a
leaf only as a testbed.core.NodeView.

The evictable leaves wait in one heap kept across evictions: a leaf is offered (with its key
then) whenever it becomes evictable or a member its key may read changes while it is, and an
entry is taken only if its node is still an evictable leaf with that key. So an eviction pops
what it frees instead of rescanning the tree, in the same order a fresh scan would give.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from testbed.core import NodeView


class RadixNode:
    __slots__ = ("key", "pages", "children", "parent", "lock_ref", "last_access", "hits",
                 "created", "priority", "nid")

    def __init__(self, key: np.ndarray, pages: np.ndarray, parent: "RadixNode | None", nid: int, tick: int):
        self.key = key  # int32 token ids, len == len(pages) * page_size
        self.pages = pages  # int64 page ids
        self.children: dict[bytes, RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = tick
        self.hits = 0
        self.created = tick
        self.priority = 0
        self.nid = nid  # creation order: the deterministic tie-break

    @property
    def num_pages(self) -> int:
        return len(self.pages)


EvictionKey = Callable[[NodeView], tuple]  # RadixNode has every member of NodeView


def _common_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return n if diff.size == 0 else int(diff[0])


class RadixCache:
    shares = True

    def __init__(self, page_size: int, eviction_key: EvictionKey):
        self.page_size = page_size
        self.eviction_key = eviction_key
        self._nid = 0
        self._tick = 0
        self.root = RadixNode(np.zeros(0, np.int32), np.zeros(0, np.int64), None, self._next_id(), 0)
        self.root.lock_ref = 1  # never evicted
        self.cached_pages = 0  # pages held by the tree
        self.evictable_pages = 0  # pages in nodes with lock_ref == 0
        self.evicted_pages_total = 0
        self._heap: list = []  # (key, nid, seq, node) offered; stale entries are skipped when popped
        self._seq = 0  # entry tie-break: a node offered twice with one key
        self._num_nodes = 0  # bounds the heap: rebuilt when stale entries outnumber the nodes

    def _offer(self, node: RadixNode) -> None:
        """Queue node for eviction if it is an evictable leaf now (with its key now)."""
        if node.lock_ref == 0 and not node.children and node is not self.root:
            self._seq += 1
            heapq.heappush(self._heap, (self.eviction_key(node), node.nid, self._seq, node))

    def _in_tree(self, node: RadixNode) -> bool:
        parent = node.parent
        return parent is not None and parent.children.get(self._child_key(node.key, 0)) is node

    def _next_id(self) -> int:
        self._nid += 1
        return self._nid - 1

    def _child_key(self, ids: np.ndarray, pos: int) -> bytes:
        return ids[pos:pos + self.page_size].tobytes()

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    # ---- lookup -----------------------------------------------------------------------
    def peek(self, ids: np.ndarray | None) -> int:
        """Length of the longest cached, page-aligned prefix of ids; changes nothing."""
        return self.peek_cost(ids)[0]

    def peek_cost(self, ids: np.ndarray | None) -> tuple[int, int]:
        """(matched tokens, evictable pages among them): locking that match would take
        those pages out of the evictable pool. Changes nothing."""
        if ids is None:
            return 0, 0
        node, pos, n_ids, pinned = self.root, 0, len(ids), 0
        while pos + self.page_size <= n_ids:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                break
            m = self._aligned(_common_len(child.key, ids[pos:]))
            pos += m
            if child.lock_ref == 0:
                pinned += m // self.page_size
            if m < len(child.key):
                break
            node = child
        return pos, pinned

    def match(self, ids: np.ndarray | None, priority: int = 0, count_hit: bool = True
              ) -> tuple[RadixNode, int, np.ndarray]:
        """Longest cached prefix: (node ending it, its length in tokens, its pages).

        Splits an edge matched part way, so that the node returned ends exactly at the
        match and can be locked. Counts a hit on every node of the path."""
        if ids is None:
            return self.root, 0, np.zeros(0, np.int64)
        self._tick += 1
        node, pos, n_ids = self.root, 0, len(ids)
        pages = []
        while pos + self.page_size <= n_ids:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                break
            m = self._aligned(_common_len(child.key, ids[pos:]))
            if m < len(child.key):
                child = self._split(child, m)
            child.last_access = self._tick
            child.hits += count_hit
            child.priority = max(child.priority, priority)
            self._offer(child)
            pages.append(child.pages)
            pos += m
            node = child
            if m == 0:
                break
        return node, pos, (np.concatenate(pages) if pages else np.zeros(0, np.int64))

    def _split(self, child: RadixNode, m: int) -> RadixNode:
        """Cut child's edge after m tokens; returns the new upper node."""
        p = m // self.page_size
        upper = RadixNode(child.key[:m], child.pages[:p], child.parent, self._next_id(), child.last_access)
        upper.lock_ref = child.lock_ref
        upper.hits, upper.priority, upper.created = child.hits, child.priority, child.created
        upper.parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.pages = child.key[m:], child.pages[p:]
        child.parent = upper
        upper.children[self._child_key(child.key, 0)] = child
        self._num_nodes += 1
        self._offer(child)  # fewer pages now (a key may read num_pages)
        return upper

    def unhit(self, node: RadixNode) -> None:
        """Take back the hits a match counted on node's path (an admission undone)."""
        while node is not self.root:
            node.hits -= 1
            self._offer(node)
            node = node.parent

    # ---- locking ----------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= node.num_pages
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("radix unlock of a node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_pages += node.num_pages
                self._offer(node)
            node = node.parent

    # ---- insert -----------------------------------------------------------------------
    def insert(self, ids: np.ndarray, pages: np.ndarray, priority: int = 0) -> int:
        """Add ids[:len(pages)*page_size] with their pages.

        Returns the number of leading tokens the tree already held: the caller keeps its
        own pages for those and must free the ones it does not share; the tree takes
        ownership of the pages after that point."""
        n = len(pages) * self.page_size
        ids = ids[:n]
        self._tick += 1
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                leaf = RadixNode(ids[pos:].copy(), pages[pos // self.page_size:].copy(), node,
                                 self._next_id(), self._tick)
                leaf.priority = priority
                node.children[self._child_key(ids, pos)] = leaf
                self.cached_pages += leaf.num_pages
                self.evictable_pages += leaf.num_pages
                self._num_nodes += 1
                self._offer(leaf)
                return pos
            m = self._aligned(_common_len(child.key, ids[pos:]))
            if m < len(child.key):
                child = self._split(child, m)
            child.last_access = self._tick
            child.priority = max(child.priority, priority)
            self._offer(child)
            pos += m
            node = child
        return pos

    # ---- eviction ---------------------------------------------------------------------
    def evict(self, num_pages: int) -> np.ndarray:
        """Free at least num_pages pages from unreferenced leaves (fewer if not enough are
        evictable), smallest (key, nid) first; returns the freed page ids for the allocator."""
        if num_pages <= 0:
            return np.zeros(0, np.int64)
        if len(self._heap) > 2 * self._num_nodes + 64:
            self._rebuild_heap()
        key, heap = self.eviction_key, self._heap
        freed, got = [], 0
        while got < num_pages and heap:
            k, _, _, node = heapq.heappop(heap)
            if node.lock_ref or node.children or not self._in_tree(node) or key(node) != k:
                continue  # stale: locked, grown, evicted, or offered again with its newer key
            freed.append(node.pages)
            got += node.num_pages
            self._remove_leaf(node)
            self._offer(node.parent)
        self.evicted_pages_total += got
        return np.concatenate(freed) if freed else np.zeros(0, np.int64)

    def _rebuild_heap(self) -> None:
        """Only the evictable leaves, with their keys now (drops the stale entries)."""
        self._heap = []
        for node in self.nodes():
            self._offer(node)

    def _remove_leaf(self, node: RadixNode) -> None:
        del node.parent.children[self._child_key(node.key, 0)]
        self.cached_pages -= node.num_pages
        self.evictable_pages -= node.num_pages
        self._num_nodes -= 1

    # ---- inspection -------------------------------------------------------------------
    def nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root:
                yield node

    def all_pages(self) -> np.ndarray:
        parts = [n.pages for n in self.nodes()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def check(self) -> None:
        """Tree-local invariants: counters agree with the nodes, locks consistent."""
        cached = evictable = 0
        for node in self.nodes():
            if len(node.key) != node.num_pages * self.page_size or node.num_pages == 0:
                raise AssertionError(f"radix node {node.nid}: key/pages length mismatch")
            cached += node.num_pages
            if node.lock_ref == 0:
                evictable += node.num_pages
                if any(c.lock_ref > 0 for c in node.children.values()):
                    raise AssertionError(f"radix node {node.nid} unlocked with a locked child")
            elif node.lock_ref < 0:
                raise AssertionError(f"radix node {node.nid}: negative lock_ref")
        if cached != self.cached_pages or evictable != self.evictable_pages:
            raise AssertionError(
                f"radix counters drifted: cached {self.cached_pages} vs {cached}, "
                f"evictable {self.evictable_pages} vs {evictable}")
