"""Exercise 4's check rejects known-wrong pools and arithmetic, and accepts right ones written differently."""
from __future__ import annotations

import math
import sys
from collections import deque
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


# ---- right ------------------------------------------------------------------------------------
class StackPool:  # the solution
    def __init__(self, num_blocks):
        self.num_blocks, self.free = num_blocks, list(range(num_blocks))

    @property
    def num_free_blocks(self):
        return len(self.free)

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} blocks, {len(self.free)} free")
        return [self.free.pop() for _ in range(n)]

    def free_blocks(self, blocks):
        self.free.extend(blocks)


class QueuePool(StackPool):
    """Hands out the oldest free block first, from a deque."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.free = deque(range(num_blocks))

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough free blocks")
        return [self.free.popleft() for _ in range(n)]


class SetPool(StackPool):
    """Keeps the free blocks in a set and hands out the lowest ids."""

    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.free = set(range(num_blocks))

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough free blocks")
        got = sorted(self.free)[:n]
        self.free -= set(got)
        return got

    def free_blocks(self, blocks):
        self.free |= set(blocks)


def blocks_needed(num_tokens, num_held, block_size):  # the solution
    return max(0, -(-num_tokens // block_size) - num_held)


def blocks_needed_ceil(num_tokens, num_held, block_size):
    return max(0, math.ceil(num_tokens / block_size) - num_held)


def blocks_needed_add(num_tokens, num_held, block_size):
    return max(0, (num_tokens + block_size - 1) // block_size - num_held)


def slot(table, position, block_size):  # the solution
    return table[position // block_size] * block_size + position % block_size


def slot_divmod(table, position, block_size):
    block, offset = divmod(position, block_size)
    return table[block] * block_size + offset


RIGHT = [(StackPool, blocks_needed, slot), (QueuePool, blocks_needed_ceil, slot_divmod),
         (SetPool, blocks_needed_add, slot)]


# ---- wrong pools ------------------------------------------------------------------------------
class HandsOutTwice(StackPool):
    """Returns free blocks without taking them off the list."""

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough")
        return self.free[len(self.free) - n:]


class FailedGetChangesState(StackPool):
    """Pops blocks one by one and only then finds out there are not enough."""

    def get_new_blocks(self, n):
        got = []
        for _ in range(n):
            if not self.free:
                raise RuntimeError("ran out")
            got.append(self.free.pop())
        return got


class RefusesTheLastBlock(StackPool):
    """Off by one: refuses when exactly n blocks are free."""

    def get_new_blocks(self, n):
        if n >= len(self.free) and n:
            raise RuntimeError("not enough")
        return [self.free.pop() for _ in range(n)]


class LosesFreedBlocks(StackPool):
    def free_blocks(self, blocks):
        self.free.extend(blocks[1:])


class ReturnsTooFew(StackPool):
    def get_new_blocks(self, n):
        if n > len(self.free):
            raise RuntimeError("not enough")
        return [self.free.pop() for _ in range(max(0, n - 1))]


class OverdraftsSilently(StackPool):
    """Hands out what it has, without raising."""

    def get_new_blocks(self, n):
        return [self.free.pop() for _ in range(min(n, len(self.free)))]


class WrongError(StackPool):
    def get_new_blocks(self, n):
        if n > len(self.free):
            raise ValueError("not enough")
        return [self.free.pop() for _ in range(n)]


class IdsFromOne(StackPool):
    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.free = list(range(1, num_blocks + 1))


# ---- wrong arithmetic -------------------------------------------------------------------------
def blocks_needed_floor(num_tokens, num_held, block_size):
    return max(0, num_tokens // block_size - num_held)


def blocks_needed_plus_one(num_tokens, num_held, block_size):
    return max(0, num_tokens // block_size + 1 - num_held)


def blocks_needed_negative(num_tokens, num_held, block_size):
    return -(-num_tokens // block_size) - num_held


def blocks_needed_total(num_tokens, num_held, block_size):
    return -(-num_tokens // block_size)  # all the blocks, not the *more* ones


def slot_no_scale(table, position, block_size):
    return table[position // block_size] + position % block_size


def slot_position_offset(table, position, block_size):
    return table[position // block_size] * block_size + position


def slot_wrong_block(table, position, block_size):
    return table[position % len(table)] * block_size + position % block_size


WRONG = [(HandsOutTwice, blocks_needed, slot), (FailedGetChangesState, blocks_needed, slot),
         (RefusesTheLastBlock, blocks_needed, slot), (LosesFreedBlocks, blocks_needed, slot),
         (ReturnsTooFew, blocks_needed, slot), (OverdraftsSilently, blocks_needed, slot),
         (WrongError, blocks_needed, slot), (IdsFromOne, blocks_needed, slot),
         (StackPool, blocks_needed_floor, slot), (StackPool, blocks_needed_plus_one, slot),
         (StackPool, blocks_needed_negative, slot), (StackPool, blocks_needed_total, slot),
         (StackPool, blocks_needed, slot_no_scale), (StackPool, blocks_needed, slot_position_offset),
         (StackPool, blocks_needed, slot_wrong_block)]


def name(case) -> str:
    return "-".join(getattr(f, "__name__", "?") for f in case)


@pytest.mark.parametrize("case", WRONG, ids=name)
def test_check_rejects_a_wrong_allocator(case):
    with pytest.raises(AssertionError):
        checks.check_allocator(*case)


@pytest.mark.parametrize("case", RIGHT, ids=name)
def test_check_accepts_a_right_allocator(case, capsys):
    checks.check_allocator(*case)
    assert "passed:" in capsys.readouterr().out


def test_a_wrong_pool_is_caught_before_the_engine_runs():
    """The pool checks find each wrong pool on their own (clear messages), not only the engine's run."""
    for pool in {case[0] for case in WRONG} - {StackPool}:
        with pytest.raises(AssertionError):
            checks.check_pool(pool)
