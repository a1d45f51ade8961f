"""Automatic prefix caching: blocks of a shared prompt prefix computed once (lesson 8).

vLLM's design (SGLang's RadixAttention finds the same hits with a radix tree):

* Only *full* blocks are cached, each named by a key: its parent block's hash and its own
  token ids, so it names the whole prefix up to the block's end. The dict compares token
  ids exactly: a wrong hit needs two parents whose 64-bit hashes collide.
* Blocks carry reference counts: a cached block can sit in many block tables at once.
* A freed block keeps its key and joins the free queue's tail; it loses its key only when
  it reaches the head and a fresh block is needed: least-recently-used eviction.
"""

from __future__ import annotations

from collections import OrderedDict

from ..request import Request, token_list


def block_keys(request: Request, block_size: int, num_blocks: int) -> list[tuple]:
    """The keys of the request's first `num_blocks` full blocks, each computed once."""
    keys = request.block_keys
    while len(keys) < num_blocks:
        i = len(keys)
        # ints and tuples of ints hash the same in every process
        parent = hash(keys[-1]) if keys else 0
        keys.append((parent, tuple(token_list(request.token_ids(i * block_size, block_size)))))
    return keys[:num_blocks]


class PrefixCachingBlockPool:
    """The pool of `KVCacheManager` with prefix caching on: reference counts, a key for
    every cached block, and free blocks in least-recently-used order."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.key: list[tuple | None] = [None] * num_blocks
        self.free = OrderedDict.fromkeys(range(num_blocks))  # head: evicted first
        self.cached: dict[tuple, int] = {}  # key -> block

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds, cached or not: all can be handed out."""
        return len(self.free)

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self.free)} free")
        blocks = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            self.evict(block)
            self.ref_cnt[block] = 1
            blocks.append(block)
        return blocks

    def free_blocks(self, blocks: list[int]) -> None:
        """One reference fewer on each; a block nobody holds joins the queue's tail, key kept."""
        for block in blocks:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.free[block] = None

    def touch(self, blocks: list[int]) -> None:
        """One reference more on each cached block a request reuses."""
        for block in blocks:
            if self.ref_cnt[block] == 0:
                del self.free[block]
            self.ref_cnt[block] += 1

    def num_free(self, blocks: list[int]) -> int:
        """How many of `blocks` sit in the free queue (reusing them takes them out of it)."""
        return sum(self.ref_cnt[b] == 0 for b in blocks)

    def lookup(self, keys: list[tuple]) -> list[int]:
        """The cached blocks of the longest run of `keys` from the start."""
        blocks = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cache(self, block: int, key: tuple) -> None:
        """Name a block just filled (the first copy of a key stays the cached one)."""
        if self.key[block] is None and key not in self.cached:
            self.key[block] = key
            self.cached[key] = block

    def evict(self, block: int) -> None:
        key = self.key[block]
        if key is not None:
            del self.cached[key]
            self.key[block] = None
