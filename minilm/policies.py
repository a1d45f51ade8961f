"""The three batching policies of DESIGN.md. A policy is a small class: `schedule(s)`
decides the step's work by calling the scheduler's verbs (scheduler.py), and the
class carries its own rules: which requests it can ever run (`check_request`) and
its default token budget (`default_token_budget`).

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

from abc import ABC, abstractmethod

from .config import EngineConfig
from .request import Request
from .scheduler import Scheduler


class Policy(ABC):
    """Base class of scheduling policies: a subclass defines `schedule`.

    The defaults suit a policy that runs each prompt whole in one step (as yours in
    exercise 3 does): a step has room for the longest sequence, and a request whose
    prompt (or whole preempted sequence) could never fit one step is refused up front.
    """

    name = "policy"

    @abstractmethod
    def schedule(self, s: Scheduler) -> None:
        """Decide the step's work with `s`'s verbs: schedule_running, admit, schedule_padding."""

    def default_token_budget(self, config: EngineConfig) -> int | None:
        """max_num_batched_tokens when the user gives none (None: the policy has no budget)."""
        return max(config.max_model_len, config.max_num_seqs)

    def check_request(self, req: Request, config: EngineConfig) -> None:
        """Raise ValueError for a request this policy could never run."""
        if req.max_len - 1 > config.max_num_batched_tokens:
            raise ValueError(
                f"request {req.request_id!r}: prompt ({req.prompt_len}) + max_tokens - 1 = {req.max_len - 1} "
                f"tokens > max_num_batched_tokens={config.max_num_batched_tokens}; policy {self.name!r} runs a "
                f"whole prompt (or a whole preempted sequence) in one step; raise the budget or use "
                f"policy='chunked'")


# ---- the two loops the in-flight policies share ------------------------------------
def schedule_decodes(s: Scheduler) -> None:
    """Check: one decode token for every running request whose prompt is done, oldest
    first (the budget always has room: max_num_batched_tokens >= max_num_seqs)."""
    for req in s.unscheduled_running():
        if req.num_remaining == 1:
            s.schedule_running(req, 1)


def chunk_size(s: Scheduler, req: Request) -> int:
    """A prompt's next chunk: what the budget has left, at most `long_prefill_token_threshold`
    (vLLM's cap, so one long prompt cannot take a whole step's budget)."""
    cap = s.config.long_prefill_token_threshold or req.num_remaining
    return min(req.num_remaining, s.budget, cap)


def admit_prompts(s: Scheduler, chunked: bool) -> int:
    """Fill: admit requests from the head of the queue while a batch slot, KV blocks and
    budget allow; each runs its whole prompt, or with `chunked` its first chunk.
    Returns how many were admitted."""
    admitted = 0
    while s.waiting:
        req = s.waiting[0]
        n = chunk_size(s, req) if chunked else req.num_remaining
        if n == 0 or not s.can_admit(req, n):
            break
        s.admit(req, n)
        admitted += 1
    return admitted


class StaticPolicy(Policy):
    name = "static"

    def __init__(self) -> None:
        self.batch: list[Request] = []

    def default_token_budget(self, config: EngineConfig) -> int | None:
        return None  # a batch's padded prefill runs whole, however long

    def check_request(self, req: Request, config: EngineConfig) -> None:
        pass  # no budget; the engine checks that a request's KV fits alone

    def schedule(self, s: Scheduler) -> None:
        if not s.running:  # the last batch has fully finished (only its rows ever run)
            self.batch = self.start_batch(s)
            return
        for req in s.unscheduled_running():
            s.schedule_running(req, 1)
        s.schedule_padding([r for r in self.batch if r.finished], 1)  # dead rows: the padded tensor still computes them

    def start_batch(self, s: Scheduler) -> list[Request]:
        """The longest run of waiting requests whose padded rows fit the batch and the KV
        cache together; every row gets a padded prefill and KV for the padded length."""
        rows: list[Request] = []
        for req in s.waiting:
            grown = rows + [req]
            need = len(grown) * s.kv_cache.blocks_needed(req, 0, padded_len(grown))
            if len(grown) > s.config.max_num_seqs or need > s.kv_cache.num_free_blocks:
                break
            rows = grown
        prompt_len, reserve = max((r.prompt_len for r in rows), default=0), padded_len(rows)
        for req in rows:
            s.admit(req, req.prompt_len, num_padding=prompt_len - req.prompt_len,
                    reserve_tokens=reserve, hold_kv=True)
        return rows


def padded_len(rows: list[Request]) -> int:
    """Length of a static batch's padded rows: the longest prompt plus the most new tokens."""
    return max(r.prompt_len for r in rows) + max(r.params.max_tokens for r in rows) if rows else 0


class ContinuousPolicy(Policy):
    """Orca-style. `prefill_only_steps=True` gives vLLM v0's default instead: a step that
    admits prompts runs only prompts, pausing every decode for that step."""

    name = "continuous"

    def __init__(self, prefill_only_steps: bool = False) -> None:
        self.prefill_only_steps = prefill_only_steps

    def schedule(self, s: Scheduler) -> None:
        if self.prefill_only_steps and admit_prompts(s, chunked=False):
            return
        schedule_decodes(s)
        admit_prompts(s, chunked=False)


class ChunkedPolicy(Policy):
    name = "chunked"

    def default_token_budget(self, config: EngineConfig) -> int | None:
        return max(256, config.max_num_seqs)

    def check_request(self, req: Request, config: EngineConfig) -> None:
        pass  # any prompt fits: it is cut into chunks

    def schedule(self, s: Scheduler) -> None:
        schedule_decodes(s)
        for req in s.unscheduled_running():  # prompts part-way through their prefill, oldest first
            if s.budget == 0:
                break
            s.schedule_running(req, chunk_size(s, req))
        admit_prompts(s, chunked=True)


POLICIES = {"static": StaticPolicy, "continuous": ContinuousPolicy, "chunked": ChunkedPolicy}


def make_policy(policy) -> Policy:
    """A policy object from a name, or the user's own `Policy` instance unchanged."""
    if isinstance(policy, Policy):
        return policy
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}; allowed: {', '.join(POLICIES)} or a Policy instance")
    return POLICIES[policy]()
