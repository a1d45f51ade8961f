# %% [markdown]
# # Exercise 1 · A roofline estimate, with the KV cache in it
#
# Lesson 1 counted a step's work two ways: the arithmetic it does (FLOPs) and the
# memory it moves (bytes), and found where a prefill turns compute-bound. Here you turn
# those counts into a time, then answer a question the lesson leaves open: **a decode
# step of B sequences, each with a long context behind it: at which B does the GPU's
# arithmetic, not its memory, set the step's time — and does such a B always exist?**
#
# Units throughout: FLOPs, bytes, FLOP/s, bytes/s, seconds. The FLOPs here are the
# linear layers' only (no attention, no output layer). The lab's cost model,
# `minilm/sim/costmodel.py`, writes out the full count (attention and the output layer
# included): write your three lines before you read it.
#
# **Part 1.** `linear_flops(num_params, num_tokens)`: the FLOPs of pushing `num_tokens`
# tokens through linear layers holding `num_params` weights. Think about one weight
# and one token: which arithmetic operations does that weight take part in?
#
# **Part 2.** `decode_bytes(weight_bytes, kv_bytes_per_token, context_lens)`: the bytes a
# decode step moves between memory and the chip. `context_lens[i]` is how many tokens
# sequence i had cached *before* this step; `kv_bytes_per_token` is the size of one
# token's K and V over all layers. What does every step need whatever the batch, and
# what grows with each sequence? Whether you also count the K and V the step writes
# for its new tokens (and attention reads back) is your choice: the lab's cost model
# counts both, the check accepts each way and tells you which one it found; say in a
# comment which you chose.
#
# **Part 3.** `roofline_time(flops, num_bytes, peak_flops, bandwidth)`: the step's time on a
# chip that overlaps arithmetic and memory traffic perfectly.

# %%
import math

from labs import checks


def linear_flops(num_params: float, num_tokens: int) -> float:
    """FLOPs of the linear layers for `num_tokens` tokens."""
    # BEGIN SOLUTION
    return 2.0 * num_params * num_tokens  # each weight: one multiply and one add per token
    # END SOLUTION


def decode_bytes(weight_bytes: float, kv_bytes_per_token: float, context_lens: list[int]) -> float:
    """Bytes a decode step moves: the weights once, plus the KV cache of each sequence."""
    # BEGIN SOLUTION
    # reads only: every weight once, and every cached token's K and V of every sequence
    # (the new token's K/V write, kv_bytes_per_token per sequence, is left out)
    return weight_bytes + kv_bytes_per_token * sum(context_lens)
    # END SOLUTION


def roofline_time(flops: float, num_bytes: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds for a step that does `flops` and moves `num_bytes`."""
    # BEGIN SOLUTION
    return max(flops / peak_flops, num_bytes / bandwidth)  # the slower of the two sets the time
    # END SOLUTION

# %%
# exercise check
checks.check_roofline(linear_flops, decode_bytes, roofline_time)

# %% [markdown]
# **Part 4: the crossover, KV cache included.** A decode step of `B` sequences computes one
# token per sequence, reads every weight once, and reads each sequence's cached K and V:
# `context_len` tokens of `kv_bytes_per_token` bytes each (count only those, not the new
# token's K/V). Write `compute_bound_batch(num_params, bytes_per_param, kv_bytes_per_token,
# context_len, peak_flops, bandwidth)`: the **smallest** batch `B` (an integer, at least `1`)
# whose step is compute-bound, its compute time at least its memory time — or `None` when
# no batch ever is. Settle on paper first:
#
# * with `context_len=0` this is lesson 1's crossover: what is it in terms of the ridge
#   point `peak_flops / bandwidth`?
# * each sequence added to the batch adds some compute time and some memory time: which
#   grows faster, and when can compute never catch up?
# * "at least": if the crossing falls exactly on a whole batch, which batch is it?
#
# A loop that adds one sequence at a time must know when to stop.

# %%
def compute_bound_batch(num_params: float, bytes_per_param: float, kv_bytes_per_token: float, context_len: int,
                        peak_flops: float, bandwidth: float) -> int | None:
    """Smallest decode batch whose linear-layer arithmetic takes at least as long as its memory traffic."""
    # BEGIN SOLUTION
    # each sequence adds 2·P FLOPs of compute and context_len·kv bytes of reading; the weights are read once
    gain = 2 * num_params / peak_flops - context_len * kv_bytes_per_token / bandwidth
    if gain <= 0:
        return None  # compute never catches up with memory, however big the batch
    return max(1, math.ceil(num_params * bytes_per_param / bandwidth / gain))
    # END SOLUTION

# %%
# exercise check
checks.check_compute_bound_batch(compute_bound_batch)

# %% [markdown]
# **Part 5: a token budget from a time limit.** Chunked prefill (lesson 1, section 5; lesson 6)
# adds `k` prompt tokens to the running decodes' step. A server that promises its decodes a
# gap of at most `time_limit` seconds between tokens must cap `k`. Write
# `largest_chunk(num_params, bytes_per_param, kv_bytes_per_token, context_lens, peak_flops,
# bandwidth, step_overhead, time_limit)`: the **largest** `k` (an integer, at least `0`) for which
# the step takes at most `time_limit`, or `None` when even the decodes alone take longer. The
# step: one token for each decode (`context_lens[i]` cached tokens behind sequence `i`, read as in
# part 4; there may be no decodes at all) and the `k` tokens of a new prompt, which has nothing
# cached but writes its own K and V (`kv_bytes_per_token` each); linear-layer FLOPs only, the
# weights read once; the step takes a fixed `step_overhead` plus the larger of its compute and
# memory times. Settle on paper first:
#
# * which of the step's two times grows with `k`, and by how much per token?
# * can the memory time, not the compute time, be the one that stops `k`? When?
# * "at most": if the limit is reached exactly at a whole `k`, is that `k` allowed?
#
# The check gives you a made-up chip whose numbers are powers of two, where such an exact
# case can happen without float rounding.

# %%
def largest_chunk(num_params: float, bytes_per_param: float, kv_bytes_per_token: float, context_lens: list[int],
                  peak_flops: float, bandwidth: float, step_overhead: float, time_limit: float) -> int | None:
    """Most prompt tokens that can ride in the decodes' step and keep it within `time_limit`."""
    # BEGIN SOLUTION
    budget = time_limit - step_overhead                      # what compute and memory may each take
    per_token = 2 * num_params / peak_flops                  # compute seconds per token in the step
    by_compute = budget / per_token - len(context_lens)      # the decodes' tokens come first
    memory = (num_params * bytes_per_param + kv_bytes_per_token * sum(context_lens)) / bandwidth
    by_memory = (budget - memory) * bandwidth / kv_bytes_per_token  # each chunk token writes its K/V
    k = math.floor(min(by_compute, by_memory))
    return k if k >= 0 else None
    # END SOLUTION

# %%
# exercise check
checks.check_largest_chunk(largest_chunk)

# %% [markdown]
# **Think further (no check).** Llama-3-8B keeps `128 KiB` of K/V per token because eight
# KV heads serve its thirty-two query heads (grouped-query attention, lesson 5); with one
# KV head per query head it would keep four times as much. Find the longest context at
# which its decode on an H100 can still turn compute-bound, with and without grouped-query
# attention. Then speculative decoding: a step that checks `k` drafted tokens computes
# `k + 1` tokens per sequence and reads the same cache. How does your formula change,
# and what does that say about why speculative decoding pays off?
