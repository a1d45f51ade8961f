# %% [markdown]
# # Exercise 6 · The chunk-splitting rule
#
# Chunked prefill (Sarathi-Serve's stall-free batching, DeepSpeed-FastGen's Dynamic
# SplitFuse, vLLM's default) fills each step up to a token budget:
#
# 1. every running decode gets its one token first;
# 2. what is left of the budget goes to prompts, oldest first: each gets
#    `min(its remaining prompt tokens, budget left)`, until the budget is used up.
#
# Write `split_budget(budget, num_decodes, prompt_remaining)`: the chunk size given to
# each prompt (a list as long as `prompt_remaining`, 0 for prompts that get nothing).
# The check compares it with the engine's `chunked` policy step by step.

# %%
from labs import checks


def split_budget(budget: int, num_decodes: int, prompt_remaining: list[int]) -> list[int]:
    # BEGIN SOLUTION
    left = max(0, budget - num_decodes)
    chunks = []
    for remaining in prompt_remaining:
        n = min(remaining, left)
        chunks.append(n)
        left -= n
    return chunks
    # END SOLUTION

# %%
# exercise check
checks.check_split_budget(split_budget)
