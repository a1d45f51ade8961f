# %% [markdown]
# # Exercise 1 · A roofline estimate
#
# Lesson 1's model of a step's time on a GPU:
#
# * the linear layers cost about **2 FLOPs per parameter per token** in the step;
# * a decode step reads **every weight once**, plus the cached K and V of every token of
#   every sequence in the batch;
# * the step takes as long as the slower of the two: compute (`flops / peak_flops`) or
#   memory traffic (`bytes / bandwidth`).
#
# Write the three functions. Units: FLOPs, bytes, FLOP/s, bytes/s, seconds.

# %%
from labs import checks


def linear_flops(num_params: float, num_tokens: int) -> float:
    """FLOPs of the linear layers for `num_tokens` tokens."""
    # BEGIN SOLUTION
    return 2.0 * num_params * num_tokens
    # END SOLUTION


def decode_bytes(weight_bytes: float, kv_bytes_per_token: float, context_lens: list[int]) -> float:
    """Bytes a decode step reads: the weights once, plus the KV cache of each sequence."""
    # BEGIN SOLUTION
    return weight_bytes + kv_bytes_per_token * sum(context_lens)
    # END SOLUTION


def roofline_time(flops: float, num_bytes: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds for a step that does `flops` and moves `num_bytes`."""
    # BEGIN SOLUTION
    return max(flops / peak_flops, num_bytes / bandwidth)
    # END SOLUTION

# %%
# exercise check
checks.check_roofline(linear_flops, decode_bytes, roofline_time)

# %% [markdown]
# When it passes: at what batch size does a decode step of an 8B model (16 GB of fp16
# weights) stop being memory-bound on a GPU with 989 TFLOP/s and 3.35 TB/s, ignoring
# the KV cache? (Hint: `linear_flops(8e9, B)` against `16e9` bytes.)
