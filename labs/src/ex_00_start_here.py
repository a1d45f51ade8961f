# %% [markdown]
# # Exercise 0 · Read a timeline
#
# Every engine run returns a `Timeline`. `timeline.steps` is a list of `StepRecord`s,
# and each step has `items`: `StepItem(request_id, kind, num_tokens, context_len)` with
# `kind` one of `"prefill"`, `"decode"`, `"padding"`.
#
# Write `tokens_by_kind(timeline)`: the total number of tokens of each kind over the
# whole run, as a dict with exactly the keys `"prefill"`, `"decode"`, `"padding"`.
# Use only `timeline.steps` (not `steps_df()`: the check compares against it).

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
