# %% [markdown]
# # Exercise 3 · An in-flight batching policy that keeps a reserve
#
# A policy is a class with one method, `schedule(s)`, that decides the step's work by
# calling the scheduler's verbs. The scheduler `s` gives you:
#
# * `s.unscheduled_running()`: the running requests not yet scheduled in this step,
#   oldest first;
# * `s.schedule_running(req, n)`: `n` more tokens of a running request; when KV blocks
#   run out it preempts the newest running request not yet scheduled (and returns
#   False if that was `req` itself);
# * `s.waiting` (a deque, head first), `s.can_admit(req, n)` and `s.admit(req, n)`: is
#   there a free seat (`max_num_seqs`), budget and KV for `n` tokens of the head of the
#   queue, and no preemption in this step / move it into the batch with its first `n`
#   tokens;
# * `s.budget`: tokens left in this step (`max_num_batched_tokens`, minus what is
#   scheduled); `s.num_running`: requests in the batch;
# * `s.num_free_blocks`: free KV blocks now; `s.blocks_needed(req, n)`: the blocks a
#   waiting request needs for its first `n` tokens;
# * `req.num_remaining`: tokens the request still has to compute before it samples
#   (its whole prompt when it waits; `1` for a decode).
#
# The verbs keep the books and refuse a mistake with an error that names it. *Evict*
# has already happened: after every step the scheduler retires finished requests and
# frees their KV blocks.
#
# The engine's `continuous` policy (`ContinuousPolicy` in `minilm/core/policies.py`: read
# it after you have tried) does **check** and **fill** as lesson 3 describes: a decode
# for every running request, then whole prompts from the head of the queue while
# `can_admit` allows. It admits a prompt whenever its blocks are free *now*, although
# every running request will need another block every `block_size` tokens; when none is
# left, the scheduler preempts a request and computes it again later (lesson 4). vLLM's
# V0 scheduler kept a **watermark**: it admitted a prompt only if some blocks stayed
# free after it, a reserve for the running requests to grow into.
#
# Write `MyWatermarkPolicy(watermark)`: in-flight batching as the engine's, except that it
# admits the head of the queue only if at least `watermark` KV blocks are still free
# after the prompt has taken its blocks. With `watermark=0` it must do exactly what
# `continuous` does. "Free after the prompt has taken its blocks" means free at the moment
# it is admitted, with whatever the step has already scheduled counted. The queue stays
# first come, first served.
#
# The check runs your policy and the engine's `continuous` policy (watermark `0`) on the
# same requests, simulated so that arrivals fall between the same steps everywhere, with
# a tight token budget and with a tight KV cache that forces preemptions, and compares
# every step's work, in any order. (What it assumes: a decode needs one token of the
# budget like any other, and `schedule_running` checks it; the budget always has room for
# every running request's decode, since `max_num_batched_tokens >= max_num_seqs`, so your
# decodes need no test of their own before they are scheduled.) Then it compares your
# steps at watermarks `2`, `4` and `8` with a reference written in `labs/checks.py`, and
# runs your policy on a small real model whose cache is too small for everyone: the same
# tokens must come out.

# %%
from minilm.core.policies import Policy
from labs import checks


class MyWatermarkPolicy(Policy):
    name = "my-watermark"

    def __init__(self, watermark: int = 0):
        self.watermark = watermark

    def schedule(self, s) -> None:
        # BEGIN SOLUTION
        # 1. Check first: every running request gets its next token before any newcomer,
        #    oldest first (blocks running out preempt the newest), so a long prompt can never
        #    take the budget or the blocks a decode needs.
        for req in s.unscheduled_running():
            s.schedule_running(req, 1)
        # 2. Fill: whole prompts from the head of the queue, while one fits and leaves the
        #    reserve; the free blocks are counted after the decodes took theirs. When the head
        #    does not fit, stop: first come, first served (`admit` only takes the head anyway).
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if (
                not s.can_admit(req, n)
                or s.num_free_blocks - s.blocks_needed(req, n) < self.watermark
            ):
                break
            s.admit(req, n)
        # END SOLUTION


# %%
# exercise check
checks.check_policy(MyWatermarkPolicy)

# %% [markdown]
# **Part 2: how much reserve is enough?** A watermark buys fewer preemptions with a
# slower fill of the batch. Write `smallest_safe_watermark(run, num_blocks)`: the smallest
# watermark with which a workload runs **without a single preemption**, found by
# measuring. `run(watermark)` runs *your* `MyWatermarkPolicy(watermark)` on the workload
# (on the simulated H100, a cache of `num_blocks` KV blocks) and returns its `Timeline`
# (lesson 0: `tl.steps`, `tl.requests`, and `summarize(tl)` from `minilm`). Return
# `None` if no watermark avoids preemption.
#
# What the check assumes, so that you need not guess: a watermark so large that some
# prompt can never be admitted makes `run` raise `RuntimeError` (the engine stops: nothing
# can be scheduled), and no larger watermark runs either. Nothing else is promised: the
# number of preemptions need not shrink step by step as the watermark grows. Decide
# before you code what your search may assume and when it may stop. The check runs four
# workloads and compares your answer with what it measures itself.

# %%
from minilm import summarize


def smallest_safe_watermark(run, num_blocks: int) -> int | None:
    # BEGIN SOLUTION
    # A scan from 0, not a bisection: a larger reserve changes which prompts share a step, so
    # the preemptions need not fall monotonically with the watermark (the check has such runs).
    for watermark in range(num_blocks + 1):
        try:
            tl = run(watermark)
        except RuntimeError:  # from here on some prompt can never be admitted
            return None
        if summarize(tl)["preemptions"] == 0:
            return watermark
    return None
    # END SOLUTION


# %%
# exercise check
checks.check_safe_watermark(MyWatermarkPolicy, smallest_safe_watermark)

# %% [markdown]
# **Part 3: a reserve that follows the running requests.** Part 2 measured one number per
# workload, and the check's five workloads need five different ones: a fixed watermark is the
# same in every step, while what the running requests still need is not. Write
# `MyReservePolicy()`: in-flight batching as in Part 1 (a decode for every running request,
# oldest first, then whole prompts from the head of the queue, first come, first served),
# with an admission test of your own design, so that no request is ever preempted and the
# queue is still served about as fast as with the best fixed watermark.
#
# What your policy may read: what Part 1 used, `s.config.block_size` (tokens a KV block
# holds) and `s.config.num_blocks`, and of each request `req.num_tokens` (prompt and output
# so far), `req.prompt_len`, `len(req.output_ids)` and `req.params.max_tokens`, the most output
# tokens it can have. `s.unscheduled_running()` called before the decodes lists every running
# request; keep that list (and add what you admit). Not the scheduler's private parts
# (`s._kv`, `s._running`), nor requests that have not arrived. What the engine does, so that
# you need not guess: a request's K/V lives in `ceil(slots / block_size)` blocks, a slot per
# token whose K/V is computed; a step computes one token of every decode; a request finishes
# in the step that samples its `max_tokens`-th token (in the check every request runs that
# long: the simulator never samples EOS), and its blocks are free before the next step is
# planned.
#
# The check runs your policy once on each of five workloads on the simulated H100 (`8` seats,
# `40` KV blocks): a phase of a few requests with long outputs among short chats, then a burst
# of short requests. Each workload must finish with every request served first come, first
# served and **no preemption at all**, and with a mean TTFT and a number of steps at most `10%`
# above those of the smallest fixed watermark that avoids preemption on that workload
# (measured with Part 1's reference). No fixed watermark passes all five. Its limits: it
# measures these workloads only, where `max_tokens` is exact; on others a policy that passes
# here could preempt, or wait longer than it needs.


# %%
class MyReservePolicy(Policy):
    name = "my-reserve"

    def schedule(self, s) -> None:
        # BEGIN SOLUTION
        bs = s.config.block_size

        def never_runs_out(requests, free: int) -> bool:
            """Whether `free` blocks cover what `requests` need in every later step if no one
            else is admitted. Each step adds a token to every request still running, and a
            request's blocks come back after the step that samples its last token: one that
            finishes early gives its blocks to those still growing."""
            held = sum(-(-r.num_tokens // bs) for r in requests)  # once this step has run
            # the steps each still runs, this one included
            left = [r.params.max_tokens - len(r.output_ids) for r in requests]
            for k in range(1, max(left)):  # k steps from now
                need = sum(-(-(r.num_tokens + k) // bs) for r, n in zip(requests, left) if k < n)
                if need - held > free:
                    return False
            return True

        # Decodes first, as in Part 1; keep the requests that hold blocks after this step.
        running = [req for req in s.unscheduled_running() if s.schedule_running(req, 1)]
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if not s.can_admit(req, n):
                break
            if not never_runs_out(running + [req], s.num_free_blocks - s.blocks_needed(req, n)):
                break  # first come, first served: nobody overtakes the head
            s.admit(req, n)
            running.append(req)
        # END SOLUTION


# %%
# exercise check
checks.check_adaptive_reserve(MyReservePolicy)

# %% [markdown]
# **Think further (no check).** A prompt that needs more than `num_blocks - watermark`
# blocks can never be admitted: what does your policy do with it, and what should it do
# (vLLM rejects such a request when it arrives)? What does the smallest safe watermark cost
# in steps and in TTFT on Part 2's first workload, and why can one more block of
# reserve bring a preemption back? A real model stops at EOS, often long before
# `max_tokens`: what does your Part 3 reserve then keep free for nothing, and what do you
# prefer, an occasional preemption or a queue that waits? (vLLM V1 keeps no reserve by default:
# it admits while blocks are free and preempts when they run out; recent versions add an
# optional `watermark`, a fraction of all blocks kept free when admitting, default `0`.)

# %% [markdown]
# <details><summary>Hint for Part 1 (open it if you are stuck)</summary>
#
# Running requests and waiting prompts compete for the same budget and the same blocks:
# which do you serve first, and which request does `schedule_running` preempt when
# blocks run out? And what does "first come, first served" ask of your loop when the
# head of the queue cannot be admitted?
#
# </details>

# %% [markdown]
# <details><summary>Hint for Part 3 (open it if you are stuck)</summary>
#
# Reserving now for everything every running request may still grow to is safe, and the check
# will call it slow: the requests finish at different times, and a finished request's blocks
# serve the ones still growing. When is the need for blocks greatest, if nobody else is
# admitted? Count in whole blocks, and mind the step in which a request's count grows.
#
# </details>
