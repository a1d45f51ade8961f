# %% [markdown]
# # Exercise 4 · A block allocator
#
# The paged KV cache hands out fixed-size blocks from a free list and keeps one block
# table per request. Write one:
#
# * `blocks_needed(rid, num_tokens)`: how many *more* blocks `rid` needs so its table
#   covers `num_tokens` slots;
# * `allocate(rid, num_tokens)`: grow the table to cover `num_tokens` slots — all or
#   nothing: if there are not enough free blocks, raise `RuntimeError` and change nothing;
# * `release(rid)`: give all of `rid`'s blocks back; return how many;
# * `slot(rid, position)`: the flat cache slot of token `position`:
#   `block * block_size + offset`.
#
# (`num_free`, `num_used` and `can_allocate` are given.) The check drives it with 300
# random calls and checks the invariants after each, then runs the real engine on your
# allocator — with a cache small enough to force preemptions — and compares the tokens
# it generates with the engine's own allocator.

# %%
from labs import checks


class MyBlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free = list(range(num_blocks))
        self.tables: dict[str, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def can_allocate(self, rid: str, num_tokens: int) -> bool:
        return self.blocks_needed(rid, num_tokens) <= len(self.free)

    def blocks_needed(self, rid: str, num_tokens: int) -> int:
        # BEGIN SOLUTION
        have = len(self.tables.get(rid, []))
        return max(0, -(-num_tokens // self.block_size) - have)
        # END SOLUTION

    def allocate(self, rid: str, num_tokens: int) -> None:
        # BEGIN SOLUTION
        need = self.blocks_needed(rid, num_tokens)
        if need > len(self.free):
            raise RuntimeError(f"{rid} needs {need} blocks, {len(self.free)} free")
        self.tables.setdefault(rid, []).extend(self.free.pop() for _ in range(need))
        # END SOLUTION

    def release(self, rid: str) -> int:
        # BEGIN SOLUTION
        table = self.tables.pop(rid, [])
        self.free.extend(table)
        return len(table)
        # END SOLUTION

    def slot(self, rid: str, position: int) -> int:
        # BEGIN SOLUTION
        return self.tables[rid][position // self.block_size] * self.block_size + position % self.block_size
        # END SOLUTION

# %%
# exercise check
checks.check_allocator(MyBlockAllocator)
