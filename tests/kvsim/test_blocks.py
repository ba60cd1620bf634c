"""Block pool: allocation, release, prefix reuse, eviction order, and the invariant checker itself."""

from __future__ import annotations

import pytest
from kvsim.blocks import BlockPool, PoolExhausted


def test_allocate_and_release_keep_counts():
    pool = BlockPool(10, enable_reuse=False)
    a = pool.allocate(4)
    b = pool.allocate(6)
    assert len(set(a) | set(b)) == 10 and pool.free == 0
    with pytest.raises(PoolExhausted):
        pool.allocate(1)
    pool.release(a)
    assert pool.free == 4
    pool.check([b])


def test_check_detects_a_block_owned_twice():
    pool = BlockPool(4, enable_reuse=False)
    a = pool.allocate(2)
    with pytest.raises(AssertionError, match="owners"):
        pool.check([a, a[:1]])


def test_check_detects_owned_free_block():
    pool = BlockPool(4, enable_reuse=False)
    a = pool.allocate(2)
    pool.release(a)
    with pytest.raises(AssertionError):
        pool.check([a])


def test_prefix_reuse_shares_blocks_and_counts_references():
    pool = BlockPool(8)
    first = pool.allocate(3)
    for block, key in zip(first, ["k0", "k1", "k2"]):
        pool.register(block, key)
    assert pool.peek_prefix(["k0", "k1", "x"]) == (2, 0)
    shared = pool.acquire_prefix(["k0", "k1", "x"])
    assert shared == first[:2] and pool.used == 3
    pool.check([first, shared])
    pool.release(first, keyed_prefix=3)
    assert pool.used == 2  # the two shared blocks are still referenced
    pool.release(shared, keyed_prefix=2)
    assert pool.used == 0
    assert pool.peek_prefix(["k0", "k1", "k2"]) == (3, 3)  # free but still matchable
    pool.check([])


def test_cached_free_blocks_are_evicted_least_recent_first():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for block, key in zip(blocks, ["a", "b", "c"]):
        pool.register(block, key)
    pool.release([blocks[1]], keyed_prefix=1)  # "b" released first
    pool.release([blocks[0]], keyed_prefix=1)
    fresh = pool.allocate(1)
    assert fresh == [blocks[1]]
    assert pool.peek_prefix(["b"]) == (0, 0) and pool.peek_prefix(["a"]) == (1, 1)


def test_charged_blocks_count_as_used_without_ids():
    pool = BlockPool(5, enable_reuse=False)
    owned = pool.allocate(2)
    pool.charge(3)
    assert pool.free == 0
    with pytest.raises(PoolExhausted):
        pool.charge(1)
    pool.check([owned])
    pool.uncharge(3)
    pool.release(owned)
    assert pool.free == 5
