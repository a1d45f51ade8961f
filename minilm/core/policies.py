"""The three batching policies (docs/DESIGN.md, "Policies"). A policy's `schedule(step)`
fills the step with the StepBuilder's verbs; its class carries its own rules.

static      a batch forms when the last has fully finished; prompts padded to the longest;
            finished rows compute padding until the longest row ends (lesson 2)
continuous  Orca: a decode for every running request, then whole prompts (lesson 3)
chunked     Sarathi-Serve: decodes first, then prompt chunks fill the budget (lesson 6)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..config import EngineConfig, InvalidValue
from ..request import Request
from .step import StepBuilder


class Policy(ABC):
    """A subclass defines `schedule`. The defaults suit a policy that runs each prompt whole
    in one step (as yours in exercise 3 does)."""

    name = "policy"
    whole_prompts = True  # a prompt (or a preempted sequence) must fit one step

    @abstractmethod
    def schedule(self, step: StepBuilder) -> None:
        """Fill the step with its verbs (step.py)."""

    def default_token_budget(self, config: EngineConfig) -> int | None:
        """max_num_batched_tokens when none is given (None: no budget)."""
        return max(config.max_model_len, config.max_num_seqs)

    def check_request(self, req: Request, config: EngineConfig) -> None:
        """Raise InvalidValue for a request this policy could never run."""
        if self.whole_prompts and req.max_len - 1 > config.max_num_batched_tokens:
            raise InvalidValue(
                "max_tokens",
                req.params.max_tokens,
                f"prompt ({req.prompt_len}) + max_tokens - 1 = {req.max_len - 1} tokens > "
                f"max_num_batched_tokens={config.max_num_batched_tokens}; policy {self.name!r} "
                f"runs a whole prompt (or a whole preempted sequence) in one step; raise the "
                f"budget or use policy='chunked'",
                req.request_id,
            )

    def on_finish(self, req: Request) -> list[Request]:
        """Whose KV blocks can be freed now that `req` has finished."""
        return [req]

    def kept_kv(self) -> dict[str, int]:
        """Finished requests whose KV `on_finish` kept, and their tokens in it."""
        return {}


# ---- the two loops the in-flight policies share ----
def schedule_decodes(step: StepBuilder) -> None:
    """A decode for every running request whose prompt is done, oldest first (the budget
    has room: max_num_batched_tokens >= max_num_seqs)."""
    for req in step.unscheduled_running():
        if req.num_remaining == 1:
            step.schedule_running(req, 1)


def chunk_size(step: StepBuilder, req: Request) -> int:
    """A prompt's next chunk: what the budget has left, at most `long_prefill_token_threshold`
    (vLLM's cap, so one long prompt cannot take a whole step's budget)."""
    cap = step.config.long_prefill_token_threshold or req.num_remaining
    return min(req.num_remaining, step.budget, cap)


def admit_prompts(step: StepBuilder, chunked: bool) -> int:
    """Fill: admit from the head of the queue, each with its whole prompt (or first chunk),
    while `can_admit`; how many were admitted."""
    admitted = 0
    while step.waiting:
        req = step.waiting[0]
        n = chunk_size(step, req) if chunked else req.num_remaining
        if n == 0 or not step.can_admit(req, n):
            break
        step.admit(req, n)
        admitted += 1
    return admitted


class StaticPolicy(Policy):
    """It owns its batch: its rows, how far each dead row's padding has reached, and when
    the batch's KV goes (when its last row ends)."""

    name = "static"
    whole_prompts = False  # no budget (the engine checks that a request's KV fits alone)

    def __init__(self) -> None:
        self.batch: list[Request] = []
        self.padded_end: dict[str, int] = {}  # a finished row's context, grown by its padding

    def default_token_budget(self, config: EngineConfig) -> int | None:
        return None  # a batch's padded prefill runs whole, however long

    def schedule(self, step: StepBuilder) -> None:
        if step.num_running == 0:  # the last batch is done (only its rows ever run)
            self.batch, self.padded_end = self.start_batch(step), {}
            return
        for req in step.unscheduled_running():
            step.schedule_running(req, 1)
        for req, start in self.pad_dead_rows():
            step.schedule_padding(req, start, 1)

    def pad_dead_rows(self) -> list[tuple[Request, int]]:
        """This step's padding: each dead row short of the padded end, at its next position."""
        end, rows = padded_len(self.batch), []
        for req in self.batch:
            start = self.padded_end.get(req.request_id, req.num_computed_tokens)
            if req.finished and start < end:
                rows.append((req, start))
                self.padded_end[req.request_id] = start + 1
        return rows

    def start_batch(self, step: StepBuilder) -> list[Request]:
        """Admit the longest run of waiting requests whose padded rows fit the batch and the
        KV cache."""
        rows: list[Request] = []
        for req in step.waiting:
            grown = rows + [req]
            need = len(grown) * step.blocks_needed(req, padded_len(grown))
            if len(grown) > step.config.max_num_seqs or need > step.num_free_blocks:
                break
            rows = grown
        prompt_len, reserve = max((r.prompt_len for r in rows), default=0), padded_len(rows)
        for req in rows:
            step.admit(
                req, req.prompt_len, num_padding=prompt_len - req.prompt_len, reserve_tokens=reserve
            )
        return rows

    def kept_kv(self) -> dict[str, int]:
        """The dead rows: their tokens, then the padding computed over them."""
        return {
            r.request_id: self.padded_end.get(r.request_id, r.num_computed_tokens)
            for r in self.batch
            if r.finished
        }

    def on_finish(self, req: Request) -> list[Request]:
        """A row's KV stays until the batch's last row ends; then the whole batch's goes."""
        if req not in self.batch:
            return [req]
        return list(self.batch) if all(r.finished for r in self.batch) else []


def padded_len(rows: list[Request]) -> int:
    """Length of a static batch's padded rows: the longest prompt plus the most new tokens."""
    return max(r.prompt_len for r in rows) + max(r.params.max_tokens for r in rows) if rows else 0


class ContinuousPolicy(Policy):
    """Orca-style; `prefill_only_steps=True` is vLLM v0's default: a step that admits prompts
    runs only prompts."""

    name = "continuous"

    def __init__(self, prefill_only_steps: bool = False) -> None:
        self.prefill_only_steps = prefill_only_steps

    def schedule(self, step: StepBuilder) -> None:
        if self.prefill_only_steps and admit_prompts(step, chunked=False):
            return
        schedule_decodes(step)
        admit_prompts(step, chunked=False)


class ChunkedPolicy(Policy):
    name = "chunked"
    whole_prompts = False  # any prompt fits: it is cut into chunks

    def default_token_budget(self, config: EngineConfig) -> int | None:
        return max(256, config.max_num_seqs)

    def schedule(self, step: StepBuilder) -> None:
        schedule_decodes(step)
        for req in step.unscheduled_running():  # prompts part-way through, oldest first
            if step.budget == 0:
                break
            step.schedule_running(req, chunk_size(step, req))
        admit_prompts(step, chunked=True)


POLICIES = {"static": StaticPolicy, "continuous": ContinuousPolicy, "chunked": ChunkedPolicy}


def make_policy(policy) -> Policy:
    """A policy object from a name, or the user's own `Policy` instance unchanged."""
    if isinstance(policy, Policy):
        return policy
    if policy not in POLICIES:
        raise InvalidValue("policy", policy, f"allowed: {', '.join(POLICIES)} or a Policy instance")
    return POLICIES[policy]()
