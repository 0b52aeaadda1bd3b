"""The Numba radix cache against a plain-Python tree written from SGLang's RadixCache rules.

The reference is SGLang 0.5.23's `radix_cache.py` reduced to what decides: children keyed by the
key's first page, a split where a match ends inside a node, one new leaf per insert, lock counts
moving tokens between evictable and protected, LRU eviction of unlocked leaves (ties by node
age). Hypothesis drives both with the same random operations (prompts that share prefixes,
page sizes 1, 2 and 4) and compares every result and the sizes after every step.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedir.lowering.radix_cache import RadixCache


class RefNode:
    serial = itertools.count(1)

    def __init__(self, parent: RefNode | None, key: list[int], value: list[int], now: int) -> None:
        self.parent = parent
        self.key = key
        self.value = value
        self.children: dict[tuple[int, ...], RefNode] = {}
        self.lock = 0
        self.access = now
        self.serial = next(RefNode.serial)


class RefRadix:
    """SGLang's RadixCache rules over Python objects (match_prefix, insert, locks, evict)."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.clock = 0
        self.root = RefNode(None, [], [], 0)
        self.root.lock = 1
        self.evictable = 0
        self.protected = 0

    def _common(self, a: list[int], b: list[int]) -> int:
        m = 0
        while m < min(len(a), len(b)) and a[m] == b[m]:
            m += 1
        return m - m % self.page

    def _split(self, child: RefNode, m: int) -> RefNode:
        head = RefNode(child.parent, child.key[:m], child.value[:m], self.clock)
        head.lock = child.lock
        assert child.parent is not None
        child.parent.children[tuple(head.key[: self.page])] = head
        child.key, child.value = child.key[m:], child.value[m:]
        child.parent = head
        head.children = {tuple(child.key[: self.page]): child}
        return head

    def match(self, key: list[int]) -> tuple[int, RefNode]:
        key = key[: len(key) - len(key) % self.page]
        self.clock += 1
        node, at = self.root, 0
        node.access = self.clock
        while at < len(key) and tuple(key[at: at + self.page]) in node.children:
            child = node.children[tuple(key[at: at + self.page])]
            child.access = self.clock
            m = self._common(child.key, key[at:])
            at += m
            if m < len(child.key):
                return at, self._split(child, m)
            node = child
        return at, node

    def insert(self, key: list[int], value: list[int]) -> tuple[int, RefNode]:
        key = key[: len(key) - len(key) % self.page]
        self.clock += 1
        node, at = self.root, 0
        node.access = self.clock
        while at < len(key) and tuple(key[at: at + self.page]) in node.children:
            child = node.children[tuple(key[at: at + self.page])]
            child.access = self.clock
            m = self._common(child.key, key[at:])
            at += m
            node = self._split(child, m) if m < len(child.key) else child
        if at < len(key):
            leaf = RefNode(node, key[at:], value[at: len(key)], self.clock)
            node.children[tuple(leaf.key[: self.page])] = leaf
            self.evictable += len(leaf.key)
            return at, leaf
        return at, node

    def inc_lock(self, node: RefNode) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.evictable -= len(node.key)
                self.protected += len(node.key)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock(self, node: RefNode) -> None:
        while node is not self.root:
            if node.lock == 1:
                self.evictable += len(node.key)
                self.protected -= len(node.key)
            node.lock -= 1
            node = node.parent  # type: ignore[assignment]

    def _nodes(self) -> list[RefNode]:
        out, todo = [], [self.root]
        while todo:
            n = todo.pop()
            out.append(n)
            todo.extend(n.children.values())
        return out

    def evict(self, num: int) -> list[int]:
        heap = [(n.access, n.serial, n) for n in self._nodes()
                if n is not self.root and n.lock == 0 and not n.children]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < num and heap:
            _, _, x = heapq.heappop(heap)
            freed.extend(x.value)
            parent = x.parent
            assert parent is not None
            del parent.children[tuple(x.key[: self.page])]
            self.evictable -= len(x.key)
            if parent is not self.root and parent.lock == 0 and not parent.children:
                heapq.heappush(heap, (parent.access, parent.serial, parent))
        return freed

    def values(self, node: RefNode) -> list[int]:
        parts = []
        while node is not self.root:
            parts.append(node.value)
            node = node.parent  # type: ignore[assignment]
        return [v for part in reversed(parts) for v in part]


# an operation: (kind, prompt family, length, argument)
OPS = st.lists(
    st.tuples(st.sampled_from(["insert", "insert", "match", "lock", "unlock", "evict"]),
              st.integers(0, 3), st.integers(0, 40), st.integers(0, 60)),
    min_size=1, max_size=60,
)


def _prompt(family: int, length: int, variant: int) -> list[int]:
    """Prompts of a family share a prefix; `variant` changes the tail from a point on."""
    base = [(family * 131 + i * 7) % 50 for i in range(length)]
    cut = variant % (length + 1)
    return base[:cut] + [(variant * 17 + i) % 50 + 50 for i in range(length - cut)]


@settings(max_examples=200, deadline=None)
@given(page=st.sampled_from([1, 2, 4]), ops=OPS)
def test_radix_cache_matches_the_reference(page: int, ops: list[tuple[str, int, int, int]]) -> None:
    fast, ref = RadixCache(page_size=page, nodes=4, tokens=16), RefRadix(page)
    locks: list[tuple[int, RefNode]] = []  # locks held, as (fast node, reference node)
    slot = itertools.count(1000)
    for kind, family, length, arg in ops:
        prompt = _prompt(family, length, arg)
        if kind == "insert":
            values = [next(slot) for _ in prompt]
            got, node = fast.insert(np.array(prompt, dtype=np.int64), np.array(values, dtype=np.int64))
            want, ref_node = ref.insert(prompt, values)
            assert got == want
            assert fast.values(node).tolist() == ref.values(ref_node)
        elif kind in ("match", "lock"):
            got, node = fast.match_prefix(np.array(prompt, dtype=np.int64))
            want, ref_node = ref.match(prompt)
            assert got == want
            assert fast.values(node).tolist() == ref.values(ref_node)
            if kind == "lock":
                fast.inc_lock(node)
                ref.inc_lock(ref_node)
                locks.append((node, ref_node))
        elif kind == "unlock" and locks:
            node, ref_node = locks.pop(arg % len(locks))
            fast.dec_lock(node)
            ref.dec_lock(ref_node)
        elif kind == "evict":
            assert fast.evict(arg).tolist() == ref.evict(arg)
        assert (fast.evictable_size, fast.protected_size) == (ref.evictable, ref.protected)
    for node, ref_node in locks:
        fast.dec_lock(node)
        ref.dec_lock(ref_node)
    assert fast.protected_size == 0
    assert fast.evict(10**9).tolist() == ref.evict(10**9)
    assert fast.total_size() == 0


def test_match_splits_a_node_and_locked_paths_survive_eviction() -> None:
    cache = RadixCache()
    cache.insert(np.arange(10), np.arange(100, 110))
    cache.insert(np.r_[np.arange(6), [50, 51]], np.arange(200, 208))  # shares 6 tokens: split at 6
    matched, node = cache.match_prefix(np.r_[np.arange(4), [77]])  # ends inside the 6-token node
    assert matched == 4 and cache.values(node).tolist() == [100, 101, 102, 103]
    _, leaf = cache.match_prefix(np.arange(10))
    cache.inc_lock(leaf)
    assert (cache.evictable_size, cache.protected_size) == (2, 10)
    assert cache.evict(100).tolist() == [206, 207]  # only the unlocked branch goes
    cache.dec_lock(leaf)
    assert cache.evict(100).size == 10 and cache.total_size() == 0


def test_pages_cut_keys_to_whole_pages() -> None:
    cache = RadixCache(page_size=4)
    assert cache.insert(np.arange(10))[0] == 0
    assert cache.total_size() == 8  # the last 2 tokens are not a whole page
    assert cache.match_prefix(np.r_[np.arange(6), [99, 99]])[0] == 4  # a page that differs does not match


def test_unlocking_an_unlocked_node_is_an_error() -> None:
    cache = RadixCache()
    _, node = cache.insert(np.arange(5))
    with pytest.raises(ValueError, match="dec_lock: node .* is not locked"):
        cache.dec_lock(node)
