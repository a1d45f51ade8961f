# %% [markdown]
# # Exercise 6 · The chunk-splitting rule, and short prompts behind long ones
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
# **Part 1.** Write `split_budget(budget, num_decodes, prompt_remaining, cap)`: the tokens each
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
# with and without a cap, and compares your chunks with the ones it ran. (The engine's
# rule is `chunk_size` and `ChunkedPolicy` in `minilm/core/policies.py`: write yours
# first.)

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

# %% [markdown]
# **Part 2: let short prompts through.** The cap keeps one long prompt from taking the whole
# budget, but several long prompts in a row still take `cap` tokens each, and a short
# prompt behind them waits, its TTFT growing with every long prompt ahead of it. vLLM's
# `max_long_partial_prefills` limits how many long prompts are prefilled at once, so that
# shorter ones can pass them.
#
# Write `split_budget_long(budget, num_decodes, prompt_remaining, cap, max_long)`: Part 1's
# rule with `cap > 0`, except that at most `max_long` **long** prompts — those with more
# than `cap` tokens left — get tokens in a step: the oldest ones. A long prompt past the
# limit gets `0`, and the tokens it would have taken go to the prompts behind it.
# `max_long=None` means no limit. Before you code: `split_budget_long(64, 4, [100, 100,
# 10], 16, 1)`, and a prompt with exactly `cap` tokens left: is it long? The engine has no
# such limit; the check compares with a reference in `labs/checks.py` on hand cases and
# random ones.

# %%
def split_budget_long(budget: int, num_decodes: int, prompt_remaining: list[int], cap: int,
                      max_long: int | None) -> list[int]:
    # BEGIN SOLUTION
    left = max(0, budget - num_decodes)
    chunks, longs = [], 0
    for remaining in prompt_remaining:  # oldest first
        long = remaining > cap
        if long and max_long is not None and longs == max_long:
            chunks.append(0)  # over the limit: its share goes to the prompts behind it
            continue
        n = min(remaining, left, cap)
        chunks.append(n)
        left -= n
        longs += long
    return chunks
    # END SOLUTION

# %%
# exercise check
checks.check_split_budget_long(split_budget_long)

# %% [markdown]
# **Part 3: the limit inside the engine, and what it buys.** Write `MyLongLimitPolicy`, a
# `Policy` (exercise 3) that runs your Part 2 rule in every step: the engine's chunked
# prefill, with at most `max_long` long prompts getting tokens in a step. It subclasses the
# engine's `ChunkedPolicy`, so it inherits the chunked policy's rules (a prompt may be cut);
# the cap is the engine's `s.config.long_prefill_token_threshold`. What you work with:
#
# * running requests come as two kinds: a decode (`req.num_remaining == 1`) and a prompt
#   part-way through its prefill, still running (`s.unscheduled_running()` gives both,
#   oldest first; `s.schedule_running(req, n)` gives one `n` tokens);
# * waiting prompts: `s.waiting`, `s.can_admit(req, n)` and `s.admit(req, n)`, which takes
#   **only the head** of the queue, and `s.reorder_waiting(order)`, which puts the queue in
#   `order` (every waiting request once, else an error).
#
# What the check assumes: every decode gets its token (decodes come before any prompt, as
# in the engine's chunked prefill); without a limit your policy runs exactly the engine's
# `chunked` policy; with one, a long prompt is one with more than the cap left, whether it
# is new or part-done, at most `max_long` of them get tokens in a step, the oldest, and
# what a long prompt past the limit would have taken goes to the prompts behind it; a
# waiting prompt that `can_admit` refuses ends the step's admissions (first come, first
# served: none behind it goes first). When
# the engine's cap is `0` (its "no cap"), no prompt is long: the limit holds nobody back.
# The KV cache has room for every request (nothing is preempted); you may reorder the
# queue if every request left in it is back in its place, in its order, when `schedule`
# returns. The check runs your policy on the simulated H100, `40` requests of which every
# fourth has a `3000`-`4000`-token prompt (budget `512`, cap `128`), with `max_long=None`
# against the engine's `chunked` policy, with `1`, `2`, `3` against a reference in
# `labs/checks.py`, step by step, and once with the cap `0` and `max_long=1`; it reports
# the p99 ITL each limit buys and the p99 TTFT it costs.

# %%
from minilm.core.policies import ChunkedPolicy


class MyLongLimitPolicy(ChunkedPolicy):
    name = "my-long-limit"

    def __init__(self, max_long: int | None = None):
        self.max_long = max_long

    def schedule(self, s) -> None:
        # BEGIN SOLUTION
        cap = s.config.long_prefill_token_threshold
        if not cap:  # no cap: no prompt is long, nothing to limit
            return super().schedule(s)
        for req in s.unscheduled_running():  # decodes first: one token each
            if req.num_remaining == 1:
                s.schedule_running(req, 1)
        # then the prompts in order: part-done ones (they arrived first), then the queue; all of
        # them count toward max_long, so split the rest of the budget over all together
        partial, waiting = list(s.unscheduled_running()), list(s.waiting)
        chunks = split_budget_long(s.budget, 0, [r.num_remaining for r in partial + waiting], cap,
                                   self.max_long)
        for req, n in zip(partial, chunks):
            if n:
                s.schedule_running(req, n)
        # the prompts that get no tokens step behind the others so that those can be admitted,
        # then go back to their places: the queue stays first come, first served
        chunk = dict(zip(waiting, chunks[len(partial):]))
        s.reorder_waiting(sorted(waiting, key=lambda r: chunk[r] == 0))
        for req in [r for r in waiting if chunk[r]]:
            if not s.can_admit(req, chunk[req]):
                break
            s.admit(req, chunk[req])
        s.reorder_waiting(sorted(s.waiting, key=waiting.index))
        # END SOLUTION

# %%
# exercise check
checks.check_long_limit_policy(MyLongLimitPolicy)

# %% [markdown]
# **Think further (no check).** The check's line shows what each limit buys in p99 ITL
# and costs in p99 TTFT: why does a step with fewer long chunks take less time, although
# it computes as many tokens or fewer? Which limit would you choose for an SLO of `15 ms`
# p99 ITL, and whose TTFT pays for it? Lesson 6 section 1's example, with a second and
# third `4096`-token prompt and a short one arriving behind them: with `max_long=1`, how
# many steps does the short one wait for its first token, against no limit?

# %% [markdown]
# <details><summary>Hint for Part 3 (open it if you are stuck)</summary>
#
# Settle three things before you code. In what order do the decodes, the part-done
# prompts and the queue get the budget? Your Part 2 function takes one list of prompts:
# which prompts go in it? And `admit` takes only the head of the queue: how does a short
# prompt standing behind a long one that is past the limit get its tokens?
#
# </details>
