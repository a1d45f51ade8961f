# %% [markdown]
# # Exercise 2 · Predict static batching's padding
#
# One static batch of requests with prompt lengths `p_i` and output lengths `o_i`
# (every request generates exactly `o_i` tokens):
#
# * the prefill step pads every prompt to the longest one;
# * the first output token of every row comes out of the prefill step; after that, the
#   batch runs one decode step per token until the longest output is done, and a row
#   that has finished computes a padding token in every remaining step.
#
# Write `static_padding(prompt_lens, output_lens)`: the number of padding tokens the
# engine computes for that batch. The check runs the real engine and compares.

# %%
from labs import checks


def static_padding(prompt_lens: list[int], output_lens: list[int]) -> int:
    # BEGIN SOLUTION
    prompt_pad = sum(max(prompt_lens) - p for p in prompt_lens)
    decode_pad = sum(max(output_lens) - o for o in output_lens)
    return prompt_pad + decode_pad
    # END SOLUTION

# %%
# exercise check
checks.check_static_padding(static_padding)
