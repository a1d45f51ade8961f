"""Exercise 4's check rejects known-wrong pools, forks and copy-on-write rules, and accepts right
ones written differently."""

from __future__ import annotations

import sys
from collections import Counter, deque
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


# ---- right pools ------------------------------------------------------------------------------
class StackPool:  # the solution
    def __init__(self, num_blocks):
        self.num_blocks, self.free, self.holders = (
            num_blocks,
            list(range(num_blocks)),
            [0] * num_blocks,
        )

    @property
    def num_free_blocks(self):
        return len(self.free)

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} blocks, {len(self.free)} free")
        blocks = [self.free.pop() for _ in range(n)]
        for b in blocks:
            self.holders[b] = 1
        return blocks

    def share(self, blocks):
        for b in blocks:
            self.holders[b] += 1

    def free_blocks(self, blocks):
        for b in blocks:
            self.holders[b] -= 1
            if self.holders[b] == 0:
                self.free.append(b)


class QueuePool(StackPool):
    """Hands out the oldest free block first, from a deque; holders in a Counter."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.free, self.holders = deque(range(num_blocks)), Counter()

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough free blocks")
        blocks = [self.free.popleft() for _ in range(n)]
        self.holders.update(blocks)
        return blocks

    def share(self, blocks):
        self.holders.update(blocks)

    def free_blocks(self, blocks):
        self.holders.subtract(blocks)
        self.free.extend(b for b in blocks if self.holders[b] == 0)


class SetPool(StackPool):
    """Keeps the free blocks in a set and hands out the lowest ids; holders in a dict of sets
    of... counts, kept only while a block is held."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.free, self.holders = set(range(num_blocks)), {}

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough free blocks")
        got = sorted(self.free)[:n]
        self.free -= set(got)
        self.holders.update({b: 1 for b in got})
        return got

    def share(self, blocks):
        for b in blocks:
            self.holders[b] += 1

    def free_blocks(self, blocks):
        for b in blocks:
            self.holders[b] -= 1
            if not self.holders[b]:
                del self.holders[b]
                self.free.add(b)


# ---- right forks and appends -----------------------------------------------------------------
def fork(pool, table):  # the solution
    pool.share(table)
    return list(table)


def fork_copy(pool, table):  # right: a slice copy, holders added one by one
    for b in table:
        pool.share([b])
    return table[:]


def append_slot(pool, table, num_tokens, block_size):  # the solution
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), None
    last = table[-1]
    if pool.holders[last] == 1:
        return table, None
    new = pool.get_new_blocks(1)[0]
    pool.free_blocks([last])
    return table[:-1] + [new], (last, new)


def append_slot_in_place(pool, table, num_tokens, block_size):  # right: grows the list it was given
    if len(table) * block_size == num_tokens:  # every slot of the table is taken
        table.append(pool.get_new_blocks(1)[0])
        return table, None
    last = table[-1]
    if pool.holders[last] > 1:
        (table[-1],) = pool.get_new_blocks(1)
        pool.free_blocks([last])
        return table, (last, table[-1])
    return table, None


RIGHT = [
    (StackPool, fork, append_slot),
    (QueuePool, fork_copy, append_slot_in_place),
    (SetPool, fork, append_slot),
]


# ---- wrong pools ------------------------------------------------------------------------------
class HandsOutTwice(StackPool):  # wrong: returns free blocks without taking them off the list
    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough")
        return self.free[len(self.free) - n :]


class FailedGetChangesState(
    StackPool
):  # wrong: pops blocks one by one, only then finds there are too few
    def get_new_blocks(self, n):
        got = []
        for _ in range(n):
            if not self.free:
                raise RuntimeError("ran out")
            got.append(self.free.pop())
        return got


class RefusesTheLastBlock(StackPool):  # wrong: off by one, refuses when exactly n blocks are free
    def get_new_blocks(self, n):
        if n >= len(self.free) and n:
            raise RuntimeError("not enough")
        return super().get_new_blocks(n)


class LosesFreedBlocks(StackPool):  # wrong: the first block given back never comes back
    def free_blocks(self, blocks):
        super().free_blocks(blocks[1:])


class OverdraftsSilently(StackPool):  # wrong: hands out what it has, without raising
    def get_new_blocks(self, n):
        return super().get_new_blocks(min(n, len(self.free)))


class WrongError(StackPool):  # wrong: refuses with ValueError; the engine expects RuntimeError
    def get_new_blocks(self, n):
        if n > len(self.free):
            raise ValueError("not enough")
        return super().get_new_blocks(n)


class IdsFromOne(StackPool):  # wrong: block ids 1..n, not 0..n-1
    def __init__(self, num_blocks):
        super().__init__(num_blocks + 1)
        self.free = list(range(1, num_blocks + 1))
        self.num_blocks = num_blocks


class FreesWhileShared(StackPool):  # wrong: a block is free again when any holder lets it go
    def free_blocks(self, blocks):
        for b in blocks:
            if self.holders[b]:
                self.holders[b] = 0
                self.free.append(b)


class ShareDoesNothing(StackPool):  # wrong: no holder is counted for a share
    def share(self, blocks):
        pass


class FreesEveryTime(StackPool):  # wrong: every holder's free puts the block on the free list again
    def free_blocks(self, blocks):
        for b in blocks:
            self.holders[b] -= 1
            self.free.append(b)


# ---- wrong forks and appends ------------------------------------------------------------------
def fork_without_share(
    pool, table
):  # wrong: the child holds the blocks without counting as a holder
    return list(table)


def fork_same_list(
    pool, table
):  # wrong: returns the parent's own list: when one grows, so does the other
    pool.share(table)
    return table


def append_never_copies(pool, table, num_tokens, block_size):  # wrong: writes into a shared block
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), None
    return table, None


def append_copies_always(
    pool, table, num_tokens, block_size
):  # wrong: copies a block nobody else holds
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), None
    new = pool.get_new_blocks(1)[0]
    pool.free_blocks([table[-1]])
    return table[:-1] + [new], (table[-1], new)


def append_copies_at_boundary(pool, table, num_tokens, block_size):
    # wrong: a new token that starts a block copies the shared (full) last block first
    if table and pool.holders[table[-1]] > 1:
        new = pool.get_new_blocks(1)[0]
        pool.free_blocks([table[-1]])
        table, copy = table[:-1] + [new], (table[-1], new)
    else:
        copy = None
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), copy
    return table, copy


def append_keeps_old_holder(
    pool, table, num_tokens, block_size
):  # wrong: after a copy, still holds the old block
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), None
    if pool.holders[table[-1]] == 1:
        return table, None
    new = pool.get_new_blocks(1)[0]
    return table[:-1] + [new], (table[-1], new)


def append_drops_all_holders(pool, table, num_tokens, block_size):
    # wrong: after a copy, frees the old block for every holder, though the others still read it
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), None
    last = table[-1]
    if pool.holders[last] == 1:
        return table, None
    new = pool.get_new_blocks(1)[0]
    pool.free_blocks([last] * pool.holders[last])
    return table[:-1] + [new], (last, new)


def append_copy_backwards(
    pool, table, num_tokens, block_size
):  # wrong: copy = (new, old): the new block's
    table, copy = append_slot(pool, table, num_tokens, block_size)  # garbage over the shared one
    return table, copy[::-1] if copy else None


def append_new_block_always(
    pool, table, num_tokens, block_size
):  # wrong: a new block for every token
    return table + pool.get_new_blocks(1), None


WRONG = [
    (HandsOutTwice, fork, append_slot),
    (FailedGetChangesState, fork, append_slot),
    (RefusesTheLastBlock, fork, append_slot),
    (LosesFreedBlocks, fork, append_slot),
    (OverdraftsSilently, fork, append_slot),
    (WrongError, fork, append_slot),
    (IdsFromOne, fork, append_slot),
    (FreesWhileShared, fork, append_slot),
    (ShareDoesNothing, fork, append_slot),
    (FreesEveryTime, fork, append_slot),
    (StackPool, fork_without_share, append_slot),
    (StackPool, fork_same_list, append_slot),
    (StackPool, fork, append_never_copies),
    (StackPool, fork, append_copies_always),
    (StackPool, fork, append_copies_at_boundary),
    (StackPool, fork, append_keeps_old_holder),
    (StackPool, fork, append_drops_all_holders),
    (StackPool, fork, append_copy_backwards),
    (StackPool, fork, append_new_block_always),
]


def name(case) -> str:
    return "-".join(getattr(f, "__name__", "?") for f in case)


@pytest.mark.parametrize("case", WRONG, ids=name)
def test_check_rejects_a_wrong_pool_or_rule(case):
    with pytest.raises(AssertionError):
        checks.check_shared_pool(*case)


@pytest.mark.parametrize("case", RIGHT, ids=name)
def test_check_accepts_a_right_pool_and_rule(case, capsys):
    checks.check_shared_pool(*case)
    assert "passed:" in capsys.readouterr().out


def test_a_wrong_pool_is_caught_before_the_engine_runs():
    """The pool checks find each wrong pool on their own (clear messages), not only the engine's run."""
    for pool in {case[0] for case in WRONG} - {StackPool}:
        with pytest.raises(AssertionError):
            checks.check_pool(pool)


@pytest.mark.parametrize(
    "case, words",
    [
        ((StackPool, fork, append_never_copies), "is also in the table of b"),
        ((StackPool, fork_without_share, append_slot), "hand out blocks the fork reads"),
        ((StackPool, fork_same_list, append_slot), "same list object"),
        ((StackPool, fork, append_copies_always), "in no other live sequence's table"),
        ((StackPool, fork, append_copy_backwards), "with the contents of block"),
        ((StackPool, fork, append_new_block_always), "would hold 2 blocks for 2 tokens"),
        ((StackPool, fork, append_copies_at_boundary), "would copy block"),
        ((StackPool, fork, append_keeps_old_holder), "copied it away"),
        ((FreesWhileShared, fork, append_slot), "another holder still has"),
    ],
)
def test_the_message_names_the_cause(case, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_shared_pool(*case)
