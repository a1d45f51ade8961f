# %% [markdown]
# # Exercise 4 · A block allocator
#
# The paged KV cache has two parts (`minilm/core/kv_cache.py`): a **block pool** that hands
# out block ids from a free list and takes them back, and a manager that keeps each
# request's block table and asks the pool for blocks. Write the pool, and the two
# pieces of arithmetic the manager needs:
#
# * `get_new_blocks(n)`: `n` block ids, all or nothing: if fewer than `n` are free,
#   raise `RuntimeError` — and think about *when* you find that out: the scheduler
#   treats a refused request as if nothing happened, so a refusal must leave the pool
#   exactly as it was;
# * `free_blocks(blocks)`: take blocks back (they may be handed out again at once);
# * `blocks_needed(num_tokens, num_held, block_size)`: how many *more* blocks a request
#   holding `num_held` blocks needs so that its table covers `num_tokens` slots (what
#   if it already holds enough?);
# * `slot(table, position, block_size)`: the flat cache slot where token `position` of
#   a sequence with block table `table` lives (lesson 4, section 2).
#
# (`num_free_blocks` is given.) The check drives your pool through its edges (an empty
# pool, a full one, a request for one block too many) and many random calls, checking
# after each that no block is handed out twice and none is lost; checks the arithmetic
# at block boundaries; then runs the real engine on your pool — with a cache small
# enough to force preemptions — and compares the tokens it generates with the
# engine's own pool.

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
        if n > len(self.free):  # check before taking anything: a refusal changes nothing
            raise RuntimeError(f"asked for {n} blocks, {len(self.free)} free")
        return [self.free.pop() for _ in range(n)]
        # END SOLUTION

    def free_blocks(self, blocks: list[int]) -> None:
        # BEGIN SOLUTION
        self.free.extend(blocks)
        # END SOLUTION


def blocks_needed(num_tokens: int, num_held: int, block_size: int) -> int:
    # BEGIN SOLUTION
    # ceil(num_tokens / block_size) blocks cover the slots; never a negative number more
    return max(0, -(-num_tokens // block_size) - num_held)
    # END SOLUTION


def slot(table: list[int], position: int, block_size: int) -> int:
    # BEGIN SOLUTION
    # the position's block in the table, and its offset inside that block
    return table[position // block_size] * block_size + position % block_size
    # END SOLUTION

# %%
# exercise check
checks.check_allocator(MyBlockPool, blocks_needed, slot)
