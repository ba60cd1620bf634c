"""The KV-cache block pool: fixed-size blocks, O(1) allocate/free, optional prefix reuse.

Mirrors TensorRT-LLM's block manager at the level the scheduler sees it:
- a block holds ``tokens_per_block`` tokens of every layer; a sequence of L tokens owns ceil(L / tpb) blocks;
- with reuse on, full prompt blocks are registered under a key that identifies their content and its prefix
  (a radix tree flattened into chained keys); a later request whose prompt starts with the same blocks
  references them instead of allocating (``reusedBlocks``);
- a block nobody references is free; if it holds reusable content it stays matchable until it is evicted,
  least recently released first, when a fresh block is needed. Free blocks count as free in the stats
  (``usedNumBlocks`` = referenced blocks), which is how utilization = used / max is computed upstream.

Two economies keep the simulator fast without changing what is observable:
- reference counts exist only for keyed (shareable) blocks; any other owned block has exactly one owner;
- blocks a decoding sequence grows into are ``charge``d (counted as used) without picking ids: nothing ever
  reads those ids, and the free lists always hold enough ids for every charge (they hold free + charged).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


class PoolExhausted(RuntimeError):
    """More blocks were requested than are free: a scheduler bug, never a normal outcome."""


class BlockPool:
    """A pool of ``num_blocks`` block ids."""

    def __init__(self, num_blocks: int, enable_reuse: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"BlockPool.num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_reuse = enable_reuse
        self._plain_free: list[int] = list(range(num_blocks - 1, -1, -1))  # stack; low ids handed out first
        self._cached_free: OrderedDict[Hashable, int] = OrderedDict()  # key -> block, LRU first
        self._block_of_key: dict[Hashable, int] = {}
        self._key_of_block: dict[int, Hashable] = {}
        self._refs: dict[int, int] = {}  # keyed blocks only
        self.used = 0  # referenced blocks + charged blocks
        self.charged = 0

    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    def allocate(self, count: int) -> list[int]:
        """``count`` fresh blocks with one owner each; evicts least recently released cached blocks."""
        if count <= 0:
            return []
        if count > self.free:
            raise PoolExhausted(f"BlockPool: asked for {count} blocks with {self.free} free")
        plain = self._plain_free
        take = min(count, len(plain))
        blocks = plain[len(plain) - take :]
        del plain[len(plain) - take :]
        while len(blocks) < count:
            key, block = self._cached_free.popitem(last=False)
            del self._block_of_key[key]
            del self._key_of_block[block]
            del self._refs[block]
            blocks.append(block)
        self.used += count
        return blocks

    def charge(self, count: int) -> None:
        """Count ``count`` more blocks as used by growing sequences (ids are not needed)."""
        if count > self.free:
            raise PoolExhausted(f"BlockPool: charging {count} blocks with {self.free} free")
        self.used += count
        self.charged += count

    def uncharge(self, count: int) -> None:
        self.used -= count
        self.charged -= count

    def release(self, blocks: Sequence[int], keyed_prefix: int = 0) -> None:
        """Drop one reference to each block. Only the first ``keyed_prefix`` blocks can be shared/keyed
        (prompt blocks come first), so the rest go back in bulk."""
        refs, key_of = self._refs, self._key_of_block
        for block in blocks[:keyed_prefix]:
            key = key_of.get(block)
            if key is None:
                self._plain_free.append(block)
                self.used -= 1
                continue
            r = refs[block] - 1
            refs[block] = r
            if r == 0:
                self.used -= 1
                self._cached_free[key] = block
        rest = blocks[keyed_prefix:]
        self._plain_free.extend(rest)
        self.used -= len(rest)

    def peek_prefix(self, keys: Iterable[Hashable]) -> tuple[int, int]:
        """How many leading ``keys`` are cached, and how many of those are currently free (unreferenced)."""
        if not self.enable_reuse:
            return 0, 0
        matched = free_matched = 0
        for key in keys:
            block = self._block_of_key.get(key)
            if block is None:
                break
            matched += 1
            if self._refs[block] == 0:
                free_matched += 1
        return matched, free_matched

    def acquire_prefix(self, keys: Iterable[Hashable]) -> list[int]:
        """Reference the cached blocks of the leading ``keys`` (stops at the first miss)."""
        if not self.enable_reuse:
            return []
        blocks: list[int] = []
        for key in keys:
            block = self._block_of_key.get(key)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._cached_free[key]
                self.used += 1
            self._refs[block] += 1
            blocks.append(block)
        return blocks

    def register(self, block: int, key: Hashable) -> None:
        """Make a filled, single-owner block matchable under ``key`` (first writer wins, like the radix tree)."""
        if self.enable_reuse and key not in self._block_of_key and block not in self._key_of_block:
            self._block_of_key[key] = block
            self._key_of_block[block] = key
            self._refs[block] = 1

    def check(self, owners: Iterable[Sequence[int]]) -> None:
        """Raise AssertionError unless the pool is consistent with every owner's block list.

        No block has more owners than references (a block is shared only through reuse, keyed and counted),
        no free block is owned, referenced + charged + free = total, and the pool is never over-committed.
        """
        counts: dict[int, int] = {}
        for blocks in owners:
            for block in blocks:
                counts[block] = counts.get(block, 0) + 1
        for block, n in counts.items():
            expected = self._refs.get(block, 1)
            if n != expected:
                raise AssertionError(f"block {block} has {n} owners but {expected} reference(s)")
        free_ids = set(self._plain_free) | set(self._cached_free.values())
        if len(free_ids) != len(self._plain_free) + len(self._cached_free):
            raise AssertionError("a block is listed free twice")
        if free_ids & counts.keys():
            raise AssertionError("a free block is owned")
        if len(counts) + self.charged != self.used:
            raise AssertionError(f"{len(counts)} owned + {self.charged} charged blocks but pool.used = {self.used}")
        if len(counts) + len(free_ids) != self.num_blocks:
            raise AssertionError("owned + free block ids != total blocks")
        if len(free_ids) < self.charged:
            raise AssertionError("fewer free ids than charged blocks")
        if not 0 <= self.used <= self.num_blocks:
            raise AssertionError(f"pool over-committed: used {self.used} of {self.num_blocks}")
