# %% [markdown]
# # Exercise 6 · The chunk-splitting rule
#
# Chunked prefill (Sarathi-Serve's stall-free batching, DeepSpeed-FastGen's Dynamic
# SplitFuse, vLLM V0's chunked-prefill scheduler) plans each step against a token budget,
# `max_num_batched_tokens`. What the rule has to guarantee:
#
# - a running decode needs exactly one token a step and cannot be cut, so no prompt may
#   ever delay one: decodes are served before any prompt;
# - prompts are served in the order they arrived; one that does not fit in what is left
#   is cut, and its remainder waits for the next step;
# - with a per-prompt cap (vLLM's `long_prefill_token_threshold`; `0` means no cap), no
#   prompt takes more than the cap in one step, so one long prompt cannot take the whole
#   budget from the prompts behind it.
#
# Write `split_budget(budget, num_decodes, prompt_remaining, cap)`: the tokens each
# waiting or part-done prompt gets this step (a list as long as `prompt_remaining`, oldest
# prompt first, `0` for a prompt that gets nothing).
#
# Before you code, work out by hand what the rule gives in two cases; the check tries
# both. The sources' example with a second long prompt waiting behind the first:
# `split_budget(1024, 60, [4096, 4096], 512)` — what does the second prompt get, and why
# not nothing? And `split_budget(16, 20, [30, 5], 0)`: the decodes alone take more than
# the budget (a policy that allowed it would have to skip decodes; the engine forbids it
# with `max_num_batched_tokens >= max_num_seqs`): what is left for the prompts?
#
# The check runs hand cases, then replays the engine's `chunked` policy step by step,
# with and without a cap, and compares your chunks with the ones it ran.

# %%
from labs import checks


def split_budget(budget: int, num_decodes: int, prompt_remaining: list[int], cap: int = 0) -> list[int]:
    # BEGIN SOLUTION
    left = max(0, budget - num_decodes)  # decodes first; more of them than budget leaves nothing, not less
    chunks = []
    for remaining in prompt_remaining:  # oldest first
        n = min(remaining, left, cap or remaining)  # cap 0: no cap
        chunks.append(n)
        left -= n
    return chunks
    # END SOLUTION

# %%
# exercise check
checks.check_split_budget(split_budget)
