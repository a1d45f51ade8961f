"""The three batching policies of DESIGN.md, each one `schedule` method.

static      a batch is formed only when the previous one has fully finished; prompts are
            padded to the longest; finished rows keep computing padding until the longest
            row ends; KV is reserved for the padded length of every row (lesson 2).
continuous  Orca's iteration-level scheduling: every step, one decode token for each
            running request, then whole prompts of newly admitted ones (lesson 3).
chunked     Sarathi-Serve / SplitFuse: decodes first, then prompt chunks fill what is left
            of the `max_num_batched_tokens` budget, so a long prompt never stalls the
            running decodes (lesson 6).
"""
from __future__ import annotations

from .kv_cache import cdiv
from .scheduler import Policy, Scheduler, SeqWork


def padded_len(rows) -> int:
    """Length of a static batch's padded rows: the longest prompt plus the most new tokens."""
    return max(r.prompt_len for r in rows) + max(r.params.max_tokens for r in rows)


def schedule_decodes(s: Scheduler, budget: int, work: list[SeqWork]) -> int:
    """One token for every running request that has finished its prompt; returns the budget left."""
    protected = {id(w.request) for w in work}
    for req in list(s.running):
        if budget <= 0:
            break
        if req.num_remaining != 1 or id(req) in protected or req not in s.running:
            continue
        if s.make_room(req, 1, protected):
            work.append(SeqWork(req, 1))
            protected.add(id(req))
            budget -= 1
    return budget


class StaticPolicy(Policy):
    name = "static"
    check_plans = False
    frees_on_finish = False

    def __init__(self) -> None:
        self.batch = []
        self.pad_pos: dict[str, int] = {}  # next padding position of each finished row

    def schedule(self, s: Scheduler) -> list[SeqWork]:
        if not self.batch:
            return self.start_batch(s)
        work = []
        for req in self.batch:
            if req.finished:  # a dead row: the padded tensor still computes it
                pos = self.pad_pos.setdefault(req.request_id, req.num_computed_tokens)
                work.append(SeqWork(req, 0, num_padding=1, start=pos))
                self.pad_pos[req.request_id] = pos + 1
            else:
                work.append(SeqWork(req, 1))
        return work

    def start_batch(self, s: Scheduler) -> list[SeqWork]:
        """Take waiting requests in order while the batch has room and KV for every row."""
        rows: list = []
        for req in s.waiting:
            grown = rows + [req]
            need = len(grown) * cdiv(padded_len(grown), s.allocator.block_size)
            if len(grown) > s.config.max_num_seqs or need > s.allocator.num_free:
                break
            rows = grown
        if not rows:
            return []
        prompt_len = max(r.prompt_len for r in rows)
        for req in rows:
            # every row of a padded [batch, prompt + max_new] tensor holds the same slots
            s.admit(req, 0)
            s.allocator.allocate(req.request_id, padded_len(rows))
        self.batch = rows
        return [SeqWork(r, r.prompt_len, num_padding=prompt_len - r.prompt_len) for r in rows]

    def on_step_end(self, s: Scheduler) -> None:
        if self.batch and all(r.finished for r in self.batch):
            for r in self.batch:
                s.allocator.release(r.request_id)
            self.batch, self.pad_pos = [], {}


class ContinuousPolicy(Policy):
    """Orca-style. `prefill_only_steps=True` gives vLLM v0's default instead: a step that
    admits prompts runs only prompts, pausing every decode for that step."""

    name = "continuous"
    check_plans = False

    def __init__(self, prefill_only_steps: bool = False) -> None:
        self.prefill_only_steps = prefill_only_steps

    def schedule(self, s: Scheduler) -> list[SeqWork]:
        budget = s.config.token_budget()
        work: list[SeqWork] = []
        if self.prefill_only_steps:
            self.admit_prompts(s, budget, work)
            if work:
                return work
        budget = schedule_decodes(s, budget, work)
        self.admit_prompts(s, budget, work)
        return work

    @staticmethod
    def admit_prompts(s: Scheduler, budget: int, work: list[SeqWork]) -> int:
        """Admit whole prompts (or whole preempted sequences) while slots, KV and budget allow."""
        while s.waiting and not s.preempted_this_step:
            req = s.waiting[0]
            n = req.num_remaining
            if n > budget or not s.can_admit(req, n):
                break
            s.admit(req, n)
            work.append(SeqWork(req, n))
            budget -= n
        return budget


class ChunkedPolicy(Policy):
    name = "chunked"
    check_plans = False

    def schedule(self, s: Scheduler) -> list[SeqWork]:
        budget = s.config.token_budget()
        work: list[SeqWork] = []
        budget = schedule_decodes(s, budget, work)
        # running prompts that are part-way through their prefill, oldest first
        protected = {id(w.request) for w in work}
        for req in list(s.running):
            if budget <= 0:
                break
            if id(req) in protected or req not in s.running:
                continue
            n = min(req.num_remaining, budget)
            if s.make_room(req, n, protected):
                work.append(SeqWork(req, n))
                protected.add(id(req))
                budget -= n
        # then new prompts, chunked to fit what is left
        while s.waiting and budget > 0 and not s.preempted_this_step:
            req = s.waiting[0]
            n = min(req.num_remaining, budget)
            if not s.can_admit(req, n):
                break
            s.admit(req, n)
            work.append(SeqWork(req, n))
            budget -= n
        return work


def make_policy(policy) -> Policy:
    """A policy object from a name, or the user's own `Policy` instance unchanged."""
    if isinstance(policy, Policy):
        return policy
    table = {"static": StaticPolicy, "continuous": ContinuousPolicy, "chunked": ChunkedPolicy}
    if policy not in table:
        raise ValueError(f"policy={policy!r}; allowed: {', '.join(table)} or a Policy instance")
    return table[policy]()
