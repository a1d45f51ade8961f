# %% [markdown]
# # Exercise 3 · Write an in-flight batching policy
#
# A policy is a class with one method, `schedule(s)`, that returns the step's work: a
# list of `SeqWork(request, num_tokens)`. The scheduler `s` gives you:
#
# * `s.running` (list, oldest first) and `s.waiting` (deque, head first);
# * `s.config.token_budget()`: at most this many tokens in one step;
# * `s.make_room(req, n, protected)`: KV blocks for `n` more tokens of a running request,
#   preempting the newest running request not in `protected` (a set of `id(request)`)
#   when blocks run out; returns False if `req` itself got preempted;
# * `s.can_admit(req, n)` / `s.admit(req, n)`: is there a batch slot and KV for `n`
#   tokens of the head of the queue / move it into the batch;
# * `s.preempted_this_step`: admit nobody in a step that had to preempt.
#
# *Evict* already happened: the scheduler removes finished requests and frees their KV
# blocks after every step. Your `schedule` does **check** and **fill**:
#
# 1. one decode token (`SeqWork(req, 1)`) for every running request, oldest first,
#    making room for it (protect the requests you already scheduled);
# 2. then admit whole prompts from the head of the queue (`n = req.num_remaining`) while
#    they fit in the budget and `can_admit` says yes.
#
# The check runs it on a workload and compares every step with the engine's
# `continuous` policy, then runs it with a tiny KV cache to force preemptions.

# %%
from minilm.scheduler import Policy, SeqWork
from labs import checks


class MyContinuousPolicy(Policy):
    name = "my-continuous"

    def schedule(self, s) -> list[SeqWork]:
        # BEGIN SOLUTION
        budget = s.config.token_budget()
        work, protected = [], set()
        for req in list(s.running):               # check: one decode token each
            if req not in s.running:              # preempted while making room for another
                continue
            if s.make_room(req, 1, protected):
                work.append(SeqWork(req, 1))
                protected.add(id(req))
                budget -= 1
        while s.waiting and not s.preempted_this_step:  # fill: whole prompts from the queue
            req = s.waiting[0]
            n = req.num_remaining
            if n > budget or not s.can_admit(req, n):
                break
            s.admit(req, n)
            work.append(SeqWork(req, n))
            budget -= n
        return work
        # END SOLUTION

# %%
# exercise check
checks.check_policy(MyContinuousPolicy)
