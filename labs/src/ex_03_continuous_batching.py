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
#   there a batch slot, budget and KV for `n` tokens of the head of the queue / move it
#   into the batch with its first `n` tokens;
# * `req.num_remaining`: tokens the request still has to compute before it samples
#   (its whole prompt when it waits; 1 for a decode).
#
# The verbs keep the books (budget, KV blocks, who is scheduled) and refuse a mistake
# with an error that names it. *Evict* already happened: after every step the scheduler
# retires finished requests and frees their KV blocks. Your `schedule` does **check**
# and **fill**: every running request gets its next token, then waiting requests join
# with their whole prompts for as long as they fit.
#
# The check runs your policy and the engine's `continuous` policy on one workload and
# compares every step, then runs yours with a tiny KV cache to force preemptions.

# %%
from minilm.policies import Policy
from labs import checks


class MyContinuousPolicy(Policy):
    name = "my-continuous"

    def schedule(self, s) -> None:
        # BEGIN SOLUTION
        for req in s.unscheduled_running():   # check: one decode token each
            s.schedule_running(req, 1)
        while s.waiting:                      # fill: whole prompts from the head of the queue
            req = s.waiting[0]
            if not s.can_admit(req, req.num_remaining):
                break
            s.admit(req, req.num_remaining)
        # END SOLUTION

# %%
# exercise check
checks.check_policy(MyContinuousPolicy)
