# %% [markdown]
# # Exercise 0 · Read a timeline, then predict one
#
# Every engine run returns a `Timeline`. `timeline.steps` is a list of `StepRecord`s,
# one per engine step, and each step has `items`: `StepItem(request_id, kind,
# num_tokens, context_len)` with `kind` one of `"prefill"`, `"decode"`, `"padding"`.
#
# **Part 1.** Write `tokens_by_kind(timeline)`: how many tokens of each kind the engine
# computed over the whole run, as a dict with the keys `"prefill"`, `"decode"` and
# `"padding"`. (The engine keeps the same counters: the `*_tokens` columns of
# `steps_df`, in `minilm/metrics.py`. Write yours first, then compare.) The check also
# gives you a run whose KV cache is too small, so that requests are *preempted* and
# computed again (lesson 3, section 5): count what the steps did, not what the requests
# asked for.

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
# `prompt_ids` and `max_tokens`. Run with in-flight batching (`policy="continuous"`),
# `ignore_eos=True` and a KV cache big enough that nobody is preempted, every request
# generates exactly `max_tokens` tokens, and no request is ever padded.
#
# Write `predict_tokens(specs)`: the same dict as `tokens_by_kind` would return for
# that run, from the workload alone, without running the engine (the check makes the
# engine unavailable while your function runs, in this part and the next two). Lesson 0, section 3
# shows one request: how many decode steps did `max_tokens=8` take, and where did its
# first output token come from?

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

# %% [markdown]
# **Part 3: predict the length of the run.** The same kind of run, all requests waiting
# at the start, at most `max_num_seqs` running at once (lesson 0, section 4). Write
# `predict_steps(specs, max_num_seqs)`: how many steps the engine takes. The prompts are
# short: every waiting prompt that has a free seat fits in the step. Settle first:
#
# * in how many steps does a request hold its seat, from its prefill to its last token?
# * a request that finishes in a step frees its seat when that step ends: in which
#   step does the next request in the queue take it?
# * when two seats are busy and the queue is not empty, which seat does the next
#   request get?

# %%
def predict_steps(specs, max_num_seqs: int) -> int:
    # BEGIN SOLUTION
    seats = [0] * min(max_num_seqs, len(specs))  # the step in which each seat is free again
    for spec in specs:                            # first come, first served
        seat = seats.index(min(seats))            # the first seat to free up
        seats[seat] += spec.max_tokens            # prefill (first token) + max_tokens - 1 decodes
    return max(seats, default=0)
    # END SOLUTION

# %%
# exercise check
checks.check_predict_steps(predict_steps)

# %% [markdown]
# **Part 4: predict when each request is done.** The same kind of run. Now give each step a
# cost: a step that computes `n` tokens in all (each prompt it prefills, whole, and one token
# for each decode) takes `step_time(n)` seconds, and every request is waiting at time `0`.
# Write `predict_finish_times(specs, max_num_seqs, step_time)`: a dict from each request's
# `id` to the time its last token is ready, the end of the step that made it. The check
# prices the engine's real steps with the same `step_time` (a fixed cost per step plus a cost
# per token, like lesson 1's) and compares. No formula this time: decide what you must keep
# track of from step to step, then which requests a step holds and what each brings to it.
# A new request's prefill shares its step with the decodes of those already running.

# %%
def predict_finish_times(specs, max_num_seqs: int, step_time) -> dict[str, float]:
    # BEGIN SOLUTION
    queue, running, clock, done = list(specs), {}, 0.0, {}  # running: id -> output tokens still to make
    while queue or running:
        new = []
        while queue and len(running) + len(new) < max_num_seqs:
            new.append(queue.pop(0))             # a free seat is taken at the start of a step
        clock += step_time(sum(len(s.prompt_ids) for s in new) + len(running))  # prompts + one per decode
        running = {s.id: s.max_tokens for s in new} | {r: left for r, left in running.items()}
        for r in list(running):
            running[r] -= 1                      # each makes one token: the prefill its first
            if running[r] == 0:
                done[r] = clock
                del running[r]                   # its seat is free for the next step
    return done
    # END SOLUTION

# %%
# exercise check
checks.check_predict_finish_times(predict_finish_times)

# %% [markdown]
# **Think further (no check).** Take a workload of your own and a KV cache too small for
# it (`run_workload(specs, policy="continuous", num_blocks=..., block_size=4,
# sampling={"ignore_eos": True})`), so that requests are preempted. Which of your three
# answers still hold? Predict the extra prefill tokens of one preemption of a request
# that had generated `k` tokens, then find it in the timeline.
