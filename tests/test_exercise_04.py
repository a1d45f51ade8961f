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


# ---- part 3: the most blocks parallel sampling holds -------------------------------------------
def cdiv(a, b):
    return -(-a // b)


def peak_closed_form(prompt_len, max_tokens, block_size):  # right: the solution
    full, partial = divmod(prompt_len, block_size)
    best = cdiv(prompt_len, block_size)
    for m in max_tokens:
        if m > 1:
            running = sum(1 for other in max_tokens if other >= m)
            best = max(best, full + running * cdiv(partial + m - 1, block_size))
    return best


def peak_at_each_end(prompt_len, max_tokens, block_size):
    # right, written another way: longest samples first, the count as each group of equal
    # lengths is about to end (the running count only grows between ends)
    full, partial = divmod(prompt_len, block_size)
    peak = cdiv(prompt_len, block_size)
    lengths = sorted(max_tokens, reverse=True)
    for k, m in enumerate(lengths, start=1):
        if m > 1 and (k == len(lengths) or lengths[k] < m):
            peak = max(peak, full + k * cdiv(partial + m - 1, block_size))
    return peak


def peak_step_by_step(prompt_len, max_tokens, block_size):
    # wrong in time only: counts every step right, each sample's own blocks and the prompt
    # blocks still shared, but a billion-step sampling takes minutes
    full, partial = divmod(prompt_len, block_size)
    peak, step = cdiv(prompt_len, block_size), 1
    while any(m > step for m in max_tokens):
        running = [m for m in max_tokens if m > step]  # these write token `step` now
        written = partial + step  # slots of the last prompt block and after, per running sample
        own = cdiv(written, block_size)  # a partly filled prompt block was copied or kept
        peak = max(peak, full + len(running) * own)
        step += 1
    return peak


def peak_never_copies(prompt_len, max_tokens, block_size):
    # wrong: the partly filled prompt block stays shared; only the blocks after it are each one's own
    full, partial = divmod(prompt_len, block_size)
    best = cdiv(prompt_len, block_size)
    for m in max_tokens:
        running = sum(1 for other in max_tokens if other >= m)
        after = max(0, m - 1 - (block_size - partial)) if partial else m - 1
        best = max(best, cdiv(prompt_len, block_size) + running * cdiv(after, block_size))
    return best


def peak_copies_a_full_block(prompt_len, max_tokens, block_size):
    # wrong: each sample copies the prompt's last block, even when the prompt fills it
    if prompt_len % block_size:
        return peak_closed_form(prompt_len, max_tokens, block_size)
    best = cdiv(prompt_len, block_size)
    for m in max_tokens:
        if m > 1:
            running = sum(1 for other in max_tokens if other >= m)
            own = 1 + cdiv(m - 1, block_size)
            best = max(best, prompt_len // block_size - 1 + running * own)
    return best


def peak_parent_kept(prompt_len, max_tokens, block_size):
    # wrong: the prompt's sequence is not a sample: it keeps its blocks, and n forks each copy
    full, partial = divmod(prompt_len, block_size)
    best = cdiv(prompt_len, block_size)
    for m in max_tokens:
        if m > 1:
            running = sum(1 for other in max_tokens if other >= m)
            best = max(
                best, cdiv(prompt_len, block_size) + running * cdiv(partial + m - 1, block_size)
            )
    return best


def peak_no_sharing(prompt_len, max_tokens, block_size):  # wrong: every sample its own prompt
    best = 0
    for m in max_tokens:
        running = sum(1 for other in max_tokens if other >= m)
        best = max(best, running * cdiv(prompt_len + m - 1, block_size))
    return best


def peak_last_token_written(prompt_len, max_tokens, block_size):
    # wrong: a sample also writes the K/V of its last token
    return peak_closed_form(prompt_len, [m + 1 for m in max_tokens], block_size)


def peak_floor_plus_one(prompt_len, max_tokens, block_size):
    # wrong: floor + 1 for "blocks to hold these slots": one too many at an exact boundary
    full, partial = divmod(prompt_len, block_size)
    best = prompt_len // block_size + (1 if partial else 0)
    for m in max_tokens:
        if m > 1:
            running = sum(1 for other in max_tokens if other >= m)
            best = max(best, full + running * ((partial + m - 1) // block_size + 1))
    return best


def peak_one_token_copies(prompt_len, max_tokens, block_size):
    # wrong: the closed form without its m = 1 case: a sample that writes nothing still copies
    full, partial = divmod(prompt_len, block_size)
    return max(
        full + sum(1 for o in max_tokens if o >= m) * cdiv(partial + m - 1, block_size)
        for m in max_tokens
    )


def peak_sum_at_the_end(prompt_len, max_tokens, block_size):
    # wrong: each sample's blocks when it ends, added up, as if none were freed before the others
    full, partial = divmod(prompt_len, block_size)
    own = [cdiv(partial + m - 1, block_size) for m in max_tokens if m > 1]
    return max(cdiv(prompt_len, block_size), full + sum(own))


def peak_longest_only(prompt_len, max_tokens, block_size):
    # wrong: the blocks at the last step, when only the longest samples are left
    return peak_closed_form(
        prompt_len, [max(max_tokens)] * max_tokens.count(max(max_tokens)), block_size
    )


def peak_all_run_to_the_end(prompt_len, max_tokens, block_size):
    # wrong: every sample counted until the longest ends
    return peak_closed_form(prompt_len, [max(max_tokens)] * len(max_tokens), block_size)


def peak_running_strict(prompt_len, max_tokens, block_size):
    # wrong: at a sample's last step, counts only the samples that go on after it
    full, partial = divmod(prompt_len, block_size)
    best = cdiv(prompt_len, block_size)
    for m in max_tokens:
        if m > 1:
            running = sum(1 for other in max_tokens if other > m)
            best = max(best, full + running * cdiv(partial + m - 1, block_size))
    return best


def peak_float(prompt_len, max_tokens, block_size):  # wrong: a float, from true division
    return float(peak_closed_form(prompt_len, max_tokens, block_size))


def peak_runs_the_pool(prompt_len, max_tokens, block_size):  # wrong: measures instead of predicting
    return checks.sampling_peak(StackPool, fork, append_slot, prompt_len, max_tokens, block_size)[0]


class CountingPool:  # a pool of the learner's own, made only to run part 2's append_slot on
    def __init__(self):
        self.holders, self.free, self.num_free_blocks = Counter(), list(range(10_000)), 10_000

    def get_new_blocks(self, n):
        self.num_free_blocks -= n
        blocks = [self.free.pop() for _ in range(n)]
        self.holders.update(blocks)
        return blocks

    def free_blocks(self, blocks):
        self.holders.subtract(blocks)


def peak_runs_append_slot(prompt_len, max_tokens, block_size):
    # wrong: drives part 2's append_slot on a pool of its own
    pool, table = CountingPool(), []
    for p in range(prompt_len + max(max_tokens) - 1):
        table = append_slot(pool, table, p, block_size)[0]
    return len(table)


RIGHT_PEAKS = [peak_closed_form, peak_at_each_end]
WRONG_PEAKS = {
    peak_never_copies: "held at most",
    peak_copies_a_full_block: "held at most",
    peak_parent_kept: "held at most",
    peak_no_sharing: "held at most",
    peak_last_token_written: "held at most",
    peak_floor_plus_one: "held at most",
    peak_one_token_copies: "held at most",
    peak_sum_at_the_end: "held at most",
    peak_longest_only: "held at most",
    peak_all_run_to_the_end: "held at most",
    peak_running_strict: "held at most",
    peak_float: "whole number",
    peak_runs_the_pool: "tried to run a block pool",
    peak_runs_append_slot: "tried to run a block pool",
    peak_step_by_step: "cannot be followed one at a time",
}


@pytest.mark.parametrize("peak", RIGHT_PEAKS, ids=lambda f: f.__name__)
def test_peak_check_accepts_a_right_count(peak, capsys):
    checks.check_peak_blocks(peak, StackPool, fork, append_slot)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("case", RIGHT[1:], ids=name)
def test_peak_check_runs_on_any_right_pool(case):
    checks.check_peak_blocks(peak_at_each_end, *case)


@pytest.mark.parametrize("peak", list(WRONG_PEAKS), ids=lambda f: f.__name__)
def test_peak_check_rejects_a_wrong_count(peak):
    with pytest.raises(AssertionError, match=WRONG_PEAKS[peak]):
        checks.check_peak_blocks(peak, StackPool, fork, append_slot)


@pytest.mark.parametrize(
    "peak",
    [p for p, words in WRONG_PEAKS.items() if words == "held at most"],
    ids=lambda f: f.__name__,
)
def test_a_hand_case_separates_each_wrong_count(peak):
    """Each wrong count is caught by a case chosen for it, not only by the random ones."""
    assert any(
        peak(p, list(m), bs) != checks.peak_reference(p, m, bs) for p, m, bs in checks.PEAK_CASES
    )


def test_the_pool_comes_back_after_a_prediction_that_tried_it():
    with pytest.raises(AssertionError):
        checks.check_peak_blocks(peak_runs_the_pool, StackPool, fork, append_slot)
    assert append_slot is globals()["append_slot"] and StackPool(3).num_free_blocks == 3


def test_the_peak_check_needs_a_right_part_2():
    with pytest.raises(AssertionError, match="pass part 2's check first"):
        checks.check_peak_blocks(peak_closed_form, StackPool, fork, append_never_copies)


def append_lets_go_first(pool, table, num_tokens, block_size):
    # wrong: lets go of the shared block before the copy's block is had: refused, it has still
    # taken a holder from a block another sequence reads
    if num_tokens % block_size == 0:
        return table + pool.get_new_blocks(1), None
    last = table[-1]
    if pool.holders[last] == 1:
        return table, None
    pool.free_blocks([last])
    new = pool.get_new_blocks(1)[0]
    return table[:-1] + [new], (last, new)


def append_swallows_a_full_pool(pool, table, num_tokens, block_size):
    # wrong: a full pool's refusal caught, the shared block written in place
    try:
        return append_slot(pool, table, num_tokens, block_size)
    except RuntimeError:
        return table, None


def append_pops_first(pool, table, num_tokens, block_size):
    # wrong: takes the shared block off the table it was given before asking for the copy's
    if num_tokens % block_size == 0 or pool.holders[table[-1]] == 1:
        return append_slot(pool, table, num_tokens, block_size)
    last = table.pop()
    new = pool.get_new_blocks(1)[0]
    pool.free_blocks([last])
    return table + [new], (last, new)


@pytest.mark.parametrize(
    "append, words",
    [
        (append_lets_go_first, "changed the holders of block"),
        (append_swallows_a_full_pool, "none is free"),
        (append_pops_first, "changed the table it was given"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_a_refused_copy_must_change_nothing(append, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_shared_pool(StackPool, fork, append)
