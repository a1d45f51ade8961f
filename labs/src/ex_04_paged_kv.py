# %% [markdown]
# # Exercise 4 · A block allocator
#
# The paged KV cache has two parts (`minilm/kv_cache.py`): a **block pool** that hands
# out block ids from a free list and takes them back, and a manager that keeps each
# request's block table and asks the pool for blocks. Write the pool, and the two
# pieces of arithmetic the manager needs:
#
# * `get_new_blocks(n)`: `n` block ids, all or nothing: if fewer than `n` are free,
#   raise `RuntimeError` and change nothing;
# * `free_blocks(blocks)`: take blocks back;
# * `blocks_needed(num_tokens, num_held, block_size)`: how many *more* blocks a request
#   holding `num_held` blocks needs so that its table covers `num_tokens` slots;
# * `slot(table, position, block_size)`: the flat cache slot of token `position` of a
#   sequence with block table `table`: `block * block_size + offset`.
#
# (`num_free_blocks` is given.) The check drives your pool with 300 random calls and
# checks the invariants after each, checks the arithmetic, then runs the real engine
# on your pool — with a cache small enough to force preemptions — and compares the
# tokens it generates with the engine's own pool.

# %%
from labs import checks


class MyBlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def get_new_blocks(self, n: int) -> list[int]:
        # BEGIN SOLUTION
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} blocks, {len(self.free)} free")
        return [self.free.pop() for _ in range(n)]
        # END SOLUTION

    def free_blocks(self, blocks: list[int]) -> None:
        # BEGIN SOLUTION
        self.free.extend(blocks)
        # END SOLUTION


def blocks_needed(num_tokens: int, num_held: int, block_size: int) -> int:
    # BEGIN SOLUTION
    return max(0, -(-num_tokens // block_size) - num_held)
    # END SOLUTION


def slot(table: list[int], position: int, block_size: int) -> int:
    # BEGIN SOLUTION
    return table[position // block_size] * block_size + position % block_size
    # END SOLUTION

# %%
# exercise check
checks.check_allocator(MyBlockPool, blocks_needed, slot)
