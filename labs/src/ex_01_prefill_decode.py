# %% [markdown]
# # Exercise 1 · A roofline estimate
#
# Lesson 1 counted a step's work two ways: the arithmetic it does (FLOPs) and the
# memory it moves (bytes). Here you turn those counts into a time, the way the lab's
# cost model does, and use it to answer the question lesson 1 left open: **how many
# sequences must a decode step hold before the GPU's arithmetic, not its memory, sets
# its time?**
#
# Units throughout: FLOPs, bytes, FLOP/s, bytes/s, seconds. The FLOPs here are the
# linear layers' only (no attention, no output layer).
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
# **Part 4: the ridge, as a batch size.** A decode step of B sequences computes one token per
# sequence and reads every weight once. Leave out the KV cache for now. Write
# `compute_bound_batch(num_params, bytes_per_param, peak_flops, bandwidth)`: the
# **smallest** batch size B (an integer) whose step is compute-bound, that is, whose
# compute time is at least its memory time. Your functions above can find it, or you
# can derive it on paper first. Does the answer depend on how many bytes a weight takes?
# The check tries weights of different sizes.

# %%
def compute_bound_batch(num_params: float, bytes_per_param: float, peak_flops: float, bandwidth: float) -> int:
    """Smallest decode batch whose linear-layer arithmetic takes at least as long as reading the weights."""
    # BEGIN SOLUTION
    weight_bytes = num_params * bytes_per_param
    batch = 1
    while roofline_time(linear_flops(num_params, batch), 0, peak_flops, bandwidth) < weight_bytes / bandwidth:
        batch += 1
    return batch
    # END SOLUTION

# %%
# exercise check
checks.check_compute_bound_batch(compute_bound_batch)

# %% [markdown]
# **Think further (no check).** The batch you found leaves out the KV cache. Put it back
# into `decode_bytes`, with every sequence holding a context of a thousand tokens, and let B grow
# far past your answer: does the step ever turn compute-bound? What does its intensity
# (FLOPs per byte) approach as B grows, and what does that say about batching decodes
# with long contexts?
