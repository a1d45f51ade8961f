# %% [markdown]
# # Exercise 0 · Read a timeline
#
# Every engine run returns a `Timeline`. `timeline.steps` is a list of `StepRecord`s,
# one per engine step, and each step has `items`: `StepItem(request_id, kind,
# num_tokens, context_len)` with `kind` one of `"prefill"`, `"decode"`, `"padding"`.
#
# **Part 1.** Write `tokens_by_kind(timeline)`: how many tokens of each kind the engine
# computed over the whole run, as a dict with exactly the keys `"prefill"`, `"decode"`
# and `"padding"`.

# %%
from labs import checks


def tokens_by_kind(timeline) -> dict[str, int]:
    # BEGIN SOLUTION
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in timeline.steps:
        for item in step.items:
            totals[item.kind] += item.num_tokens
    return totals
    # END SOLUTION

# %%
# exercise check
checks.check_tokens_by_kind(tokens_by_kind)

# %% [markdown]
# **Part 2: predict before you run.** A workload is a list of `RequestSpec`s, each with its
# `prompt_ids` and `max_tokens`. Run with in-flight batching (`policy="continuous"`)
# and `ignore_eos=True`, every request generates exactly `max_tokens` tokens, and no
# request is ever padded.
#
# Write `predict_tokens(specs)`: the same dict as `tokens_by_kind` would return for
# that run, computed from the workload alone, without running the engine. Look back at
# lesson 0, section 3: how many decode steps did a request with `max_tokens=8` take,
# and where did its first output token come from?

# %%
def predict_tokens(specs) -> dict[str, int]:
    # BEGIN SOLUTION
    prefill = sum(len(s.prompt_ids) for s in specs)  # every prompt token is computed once, in prefill
    decode = sum(s.max_tokens - 1 for s in specs)    # the first output token comes out of the prefill step
    return {"prefill": prefill, "decode": decode, "padding": 0}
    # END SOLUTION

# %%
# exercise check
checks.check_predict_tokens(predict_tokens)
