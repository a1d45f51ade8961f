# %% [markdown]
# # Exercise 3 · Write an in-flight batching policy
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
#   scheduled);
# * `req.num_remaining`: tokens the request still has to compute before it samples
#   (its whole prompt when it waits; 1 for a decode).
#
# The verbs keep the books and refuse a mistake with an error that names it. *Evict*
# has already happened: after every step the scheduler retires finished requests and
# frees their KV blocks. Your `schedule` does **check** and **fill** as lesson 3's
# engine does (Orca's iteration-level scheduling, whole prompts, no chunking), and
# must decide what the verbs do not decide for you:
#
# 1. **In which order?** Running requests and waiting prompts compete for the same
#    budget and the same KV blocks. Which do you serve first, and what goes wrong for
#    the other kind if you choose the other way round? (Think of a step whose budget or
#    free blocks cannot hold everyone.)
# 2. **When to stop filling?** The queue is first come, first served, and `admit` only
#    takes its head. What must your loop do when the head does not fit — and what would
#    a scheduler that let a shorter prompt behind it go first gain, and risk?
#
# The check runs your policy and the engine's `continuous` policy on the same
# requests (simulated, so arrivals fall between the same steps everywhere) and compares
# the work of every step, in any order; its budget is tight and some prompts nearly
# fill it. Then it runs your policy on a small real model with a KV cache too small
# for everyone, to force preemptions, and compares the tokens it generates.

# %%
from minilm.core.policies import Policy
from labs import checks


class MyContinuousPolicy(Policy):
    name = "my-continuous"

    def schedule(self, s) -> None:
        # BEGIN SOLUTION
        # 1. Check first: every running request gets its next token before any newcomer,
        #    so a long prompt can never take the budget or the blocks a decode needs.
        for req in s.unscheduled_running():
            s.schedule_running(req, 1)
        # 2. Fill: whole prompts from the head of the queue. When the head does not fit,
        #    stop: first come, first served (a shorter prompt behind it must not overtake,
        #    or a long prompt could wait forever; `admit` only takes the head anyway).
        while s.waiting:
            req = s.waiting[0]
            if not s.can_admit(req, req.num_remaining):
                break
            s.admit(req, req.num_remaining)
        # END SOLUTION

# %%
# exercise check
checks.check_policy(MyContinuousPolicy)
