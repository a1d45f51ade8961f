"""The paged KV cache's books: fixed-size blocks, a free list, a block table per request.

vLLM's idea (PagedAttention, SOSP'23): instead of reserving `max_len` contiguous slots per
request, hand out `block_size`-token blocks as a sequence grows and take them back when it
ends. `reserved` mode does it the pre-paging way, so lesson 4 can measure what paging saves.

As in vLLM V1, a pool hands out block ids (exercise 4 writes one; prefix_cache.py has the
caching one) and the `KVCacheManager` owns the block tables. The K/V tensors the ids index
are the model runner's.
"""

from __future__ import annotations

from ..request import Request
from .prefix_cache import PrefixCachingBlockPool, block_keys


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockPool:
    """A free list of block ids: block 0 goes first, and a freed block next (a stack), which
    keeps the KV map readable."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self.free)} free")
        rest = len(self.free) - n
        blocks = self.free[rest:][::-1]  # what n pops give, in one slice
        del self.free[rest:]
        return blocks

    def free_blocks(self, blocks: list[int]) -> None:
        """Give blocks back; the first of `blocks` is the first handed out again."""
        self.free.extend(reversed(blocks))


class KVCacheManager:
    """Every request's block table, and the pool its blocks come from. A table is replaced,
    never changed in place, when it grows: a plan that keeps one sees it as the step ran."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        reserved: bool = False,
        pool=None,
        enable_prefix_caching: bool = False,
    ):
        self.num_blocks, self.block_size, self.reserved = num_blocks, block_size, reserved
        self.caching = enable_prefix_caching
        default_pool = PrefixCachingBlockPool if enable_prefix_caching else BlockPool
        self.pool = default_pool(num_blocks) if pool is None else pool
        self.block_tables: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # of each table, blocks named in the cache
        # free blocks that keep a cached prefix, kept up to date: the KV map asks every step,
        # and a simulated GPU has thousands to scan
        self.cached_free: set[int] = set()
        self._cached_free_list: list[int] | None = []

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free_blocks

    def get_computed_blocks(self, request: Request) -> list[int]:
        """The longest cached prefix of a request that holds no blocks yet; never all of its
        tokens: the last one is recomputed so that it can sample."""
        if not self.caching or request.request_id in self.block_tables:
            return []
        return self.pool.lookup(
            block_keys(request, self.block_size, (request.num_tokens - 1) // self.block_size)
        )

    def blocks_needed(
        self,
        request: Request,
        num_new_tokens: int,
        reserve_tokens: int = 0,
        computed: list[int] = (),
    ) -> int:
        """Fresh blocks `request` needs to cover its computed tokens, the `computed` cached
        blocks it will share and `num_new_tokens` (at least `reserve_tokens` slots)."""
        owned = len(self.block_tables.get(request.request_id, ())) + len(computed)
        slots = max(
            request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens,
            reserve_tokens,
        )
        if self.reserved:
            slots = max(slots, request.max_len)
        return max(0, cdiv(slots, self.block_size) - owned)

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        reserve_tokens: int = 0,
        computed: list[int] = (),
    ) -> bool:
        """The fresh blocks are free, besides the cached ones to share (they leave the free
        queue too)."""
        return self._fresh(request, num_new_tokens, reserve_tokens, computed) is not None

    def _fresh(self, request: Request, n: int, reserve: int, computed: list[int]) -> int | None:
        need = self.blocks_needed(request, n, reserve, computed)
        shared = self.pool.num_free(computed) if computed else 0
        return need if need <= self.pool.num_free_blocks - shared else None

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        reserve_tokens: int = 0,
        computed: list[int] = (),
    ) -> list[int] | None:
        """Grow the request's table by the `computed` cached blocks it shares and fresh blocks
        for `num_new_tokens`; its table, or None (nothing changed) if too few are free."""
        need = self._fresh(request, num_new_tokens, reserve_tokens, computed)
        if need is None:
            return None
        table = self.block_tables.get(request.request_id, [])
        if need or computed:
            if computed:
                self.pool.touch(computed)
                self.num_cached_blocks[request.request_id] = len(computed)  # named already
            fresh = self.pool.get_new_blocks(need)
            table = table + list(computed) + fresh
            self.block_tables[request.request_id] = table
            if not self.cached_free.isdisjoint(table):  # cached-free blocks taken back or evicted
                self.cached_free.difference_update(table)
                self._cached_free_list = None
        if self.caching:  # not draft tokens (past num_tokens): they may be rejected
            end = min(
                request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens,
                request.num_tokens,
            )
            self.cache_blocks(request, table, end // self.block_size)
        return table

    def cache_blocks(self, request: Request, table: list[int], num_full: int) -> None:
        """Name the request's first `num_full` blocks, whose K/V this step computes (or has)."""
        done = self.num_cached_blocks.get(request.request_id, 0)
        if num_full > done:
            keys = block_keys(request, self.block_size, num_full)
            for i in range(done, num_full):
                self.pool.cache(table[i], keys[i])
            self.num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Return the request's blocks to the pool, tail first: with prefix caching its first
        blocks, the most shared, are then the last evicted."""
        table = self.block_tables.pop(request.request_id, None)
        self.num_cached_blocks.pop(request.request_id, None)
        if table:
            self.pool.free_blocks(table[::-1])
            if self.caching:
                pool = self.pool
                kept = {b for b in table if pool.ref_cnt[b] == 0 and pool.key[b] is not None}
                if kept:
                    self.cached_free |= kept
                    self._cached_free_list = None

    def snapshot(self) -> tuple[dict[str, list[int]], list[int] | None]:
        """Every block table, and the free blocks that keep a cached prefix (None without
        prefix caching), for the KV map; an unchanged list is shared between steps."""
        if self._cached_free_list is None:
            self._cached_free_list = sorted(self.cached_free)
        return dict(self.block_tables), self._cached_free_list if self.caching else None
