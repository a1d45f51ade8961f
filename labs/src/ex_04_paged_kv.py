# %% [markdown]
# # Exercise 4 · Share blocks, copy on write
#
# Lesson 4's paged cache gives every block to one sequence. Paging also allows more:
# **one block in several block tables at once**. A request for several samples of one
# prompt (vLLM's `n`, or beam search) holds the prompt's K/V once and lets every sample
# read it; a block is copied only when one sample is about to *write* into a block that
# another sample still reads (PagedAttention's copy-on-write, Kwon et al., SOSP 2023). The
# engine here runs one sample per request and has no such sharing (lesson 8's prefix
# cache shares blocks between requests, but never writes into a shared one): you write it.
#
# **Part 1: a pool with holders.** `MyBlockPool(num_blocks)` hands out block ids and
# counts, for each block, how many block tables hold it:
#
# * `get_new_blocks(n)`: `n` free blocks, each now with one holder; all or nothing: with
#   fewer than `n` free, raise `RuntimeError` and leave the pool exactly as it was;
# * `share(blocks)`: one more holder for each block;
# * `free_blocks(blocks)`: one holder fewer for each; a block is free again (and may be
#   handed out at once) only when its last holder has let it go.
#
# (`num_free_blocks` is given.) The engine runs on any pool with `get_new_blocks`,
# `free_blocks` and `num_free_blocks`; its own is `BlockPool` in
# `minilm/core/kv_cache.py`, which has no holders to count.
#
# **Part 2: fork and copy-on-write.**
#
# * `fork(pool, table)`: a new sequence (a second sample) that holds the same blocks as
#   the sequence with block table `table`: return its block table;
# * `append_slot(pool, table, num_tokens, block_size)`: a sequence with `num_tokens`
#   tokens in `table` is about to write the K/V of token number `num_tokens`. Return
#   `(new_table, copy)`: its table after making room, and `(src, dst)` if the cache must
#   first copy block `src` into block `dst` (else `None`). When does the token need a new
#   block, when may it be written in place, and when must the last block be copied first?
#
# The check drives your pool through its edges and many random calls, counting every
# block's holders itself; then grows, forks and ends sequences token by token, keeping
# the cache's contents itself: every sequence must read back its own tokens, no block
# may be written while another sequence holds it, and every block must come back in the
# end. Last, it runs the real engine on your pool with a cache small enough to preempt.
# What it assumes, so that you need not guess: it never frees a block that has no holder
# (what your pool does then is yours to choose; raising is kindest); `append_slot` may
# return the table it was given, changed in place, or a new list (the check keeps the one
# you return); `fork` returns a new list. When the pool has no block for what an append
# needs, `append_slot` lets the pool's `RuntimeError` through and leaves the pool and the
# table it was given as they were: the engine then preempts a sequence and tries again.

# %%
from labs import checks


class MyBlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks))
        self.holders = [0] * num_blocks  # how many block tables hold each block

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def get_new_blocks(self, n: int) -> list[int]:
        # BEGIN SOLUTION
        if n > len(self.free):  # check before taking anything: a refusal changes nothing
            raise RuntimeError(f"asked for {n} blocks, {len(self.free)} free")
        blocks = [self.free.pop() for _ in range(n)]
        for b in blocks:
            self.holders[b] = 1
        return blocks
        # END SOLUTION

    def share(self, blocks: list[int]) -> None:
        # BEGIN SOLUTION
        for b in blocks:
            self.holders[b] += 1
        # END SOLUTION

    def free_blocks(self, blocks: list[int]) -> None:
        # BEGIN SOLUTION
        for b in blocks:
            self.holders[b] -= 1
            if self.holders[b] == 0:  # the last holder let go
                self.free.append(b)
        # END SOLUTION


def fork(pool: MyBlockPool, table: list[int]) -> list[int]:
    # BEGIN SOLUTION
    pool.share(table)
    return list(table)  # a new list: the two tables grow apart from here
    # END SOLUTION


def append_slot(pool: MyBlockPool, table: list[int], num_tokens: int, block_size: int):
    # BEGIN SOLUTION
    if num_tokens % block_size == 0:  # the token starts a new block: nobody else can hold it
        return table + pool.get_new_blocks(1), None
    last = table[-1]
    if pool.holders[last] == 1:  # this sequence's alone: write in place
        return table, None
    new = pool.get_new_blocks(1)[0]  # shared: copy it, and let go of the shared one
    pool.free_blocks([last])
    return table[:-1] + [new], (last, new)
    # END SOLUTION

# %%
# exercise check
checks.check_shared_pool(MyBlockPool, fork, append_slot)

# %% [markdown]
# **Part 3: how many blocks do the samples hold?** A server that admits a request for `n`
# samples must know how much of its cache they will need at the worst moment. Write
# `peak_blocks(prompt_len, max_tokens, block_size)`: the largest number of blocks held at
# once (a block is held while at least one table has it) when one prompt is sampled
# `n = len(max_tokens)` times, sample `i` generating `max_tokens[i]` tokens, and your parts
# 1 and 2 run it as follows:
#
# * **step `0`, the prefill**: one sequence writes the K/V of the prompt's `prompt_len` tokens
#   (positions `0` to `prompt_len - 1`), and its logits give every sample its first token;
#   then that sequence is forked `n - 1` times. It is sample 0 itself: no sequence holds the
#   prompt without being a sample;
# * **step `s` >= 1**: each sample still running, one after another, writes the K/V of its
#   token number `s` (its tokens counted from 1; the first came from the prefill) at position
#   `prompt_len + s - 1` with `append_slot`, and computes its token `s + 1`. All samples
#   decode in lockstep, one token a step;
# * a sample of `m` tokens has them all after step `m - 1`: it ends there and frees its table
#   at the end of that step (after step 0 when `m` is 1). As in the engine, the K/V of a
#   sequence's last token is never written: no step computes with it.
#
# `prompt_len >= 1`, every `max_tokens[i] >= 1`, `block_size >= 1`. The answer must come from
# reasoning: the check calls your function with your `MyBlockPool`, `fork` and `append_slot`
# (and the engine's own pool) unavailable, then runs the sampling above on your pool and
# compares your number with the most blocks it held. It also asks about samplings far too
# long to follow a step at a time (a prompt of a million tokens, samples of a billion), and
# allows `10` seconds a call: decide which steps can hold the most before you count.

# %%
def peak_blocks(prompt_len: int, max_tokens: list[int], block_size: int) -> int:
    # BEGIN SOLUTION
    full, partial = divmod(prompt_len, block_size)
    best = -(-prompt_len // block_size)  # step 0: the prompt's blocks, one table or n
    for m in max_tokens:
        if m > 1:  # held blocks only grow while the same samples run: try each one's last step
            running = sum(1 for other in max_tokens if other >= m)
            # each running sample has its own partly filled prompt block (the last to write kept
            # the original) and the blocks of its m - 1 written tokens after it
            best = max(best, full + running * -(-(partial + m - 1) // block_size))
    return best
    # END SOLUTION

# %%
# exercise check
checks.check_peak_blocks(peak_blocks, MyBlockPool, fork, append_slot)

# %% [markdown]
# **Think further (no check).** Part 3's passing line compares four samples of a
# `1000`-token prompt with and without sharing: how does the saving grow with `n`, and with
# the prompt's length against `max_tokens`? When does sharing save nothing? Beam search forks and drops samples at every step: which
# blocks does it copy? And when the scheduler preempts one sample (lesson 4: its blocks are
# freed and it is computed again later), which of its blocks does that give back to the
# free list?
#
# <details><summary>Hint for Part 3 (open it if you are stuck)</summary>
#
# Follow a `6`-token prompt in blocks of `4`, sampled twice, through steps 0 to 2 by hand:
# after each call, which blocks does each table have, and which of them is in both? Then
# ask in which steps the total can go down.
#
# </details>
