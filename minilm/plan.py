"""One step's plan and its output: what passes, one way, from the scheduler to the
executor and from both to the timeline (docs/DESIGN.md, "One step"). A plan is fixed
once made: the runner, the clock and the recorder read it after the step has changed
the requests, so it carries all they need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .config import ModelConfig
from .request import Request


@dataclass(slots=True)
class SeqWork:
    """One request's share of a step: it computes the tokens at positions
    `start : start + num_new_tokens` of its sequence, then `num_padding` dummy tokens that
    static batching computes and throws away (lesson 2)."""

    request: Request
    num_new_tokens: int  # real tokens: a whole prompt, a chunk of one, or 1 for a decode
    num_padding: int  # dummy tokens after them
    start: int  # position of the first new token
    end: int  # context length after this step: start + num_new_tokens + num_padding
    block_table: list[int]  # the request's KV blocks for this step
    kind: str  # prefill (a prompt, a chunk, a preempted sequence recomputed) | decode | padding
    samples: bool  # this step computes the sequence's last token, so it samples the next
    num_cached: int = 0  # tokens before `start` found in the prefix cache when admitted: no compute
    draft_token_ids: list[int] = field(
        default_factory=list
    )  # the last of the new tokens are these drafts,
    #                          which the step verifies (lesson 10): it samples at each of them and after them


@dataclass
class StepPlan:
    """What the scheduler decided for one step, and the engine's state as the step runs."""

    work: list[SeqWork]
    preempted: list[Request]
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_tokens_stored: (
        int  # of their slots, those holding a token once the step has run (all drafts kept)
    )
    block_tables: dict[str, list[int]] | None = None  # for the KV map: every request's blocks,
    cached_free_blocks: list[int] | None = None  # and those nobody holds that keep a cached prefix

    @property
    def num_scheduled_tokens(self) -> int:
        """Every token the step computes, padding included."""
        return sum(w.num_new_tokens + w.num_padding for w in self.work)


@dataclass
class ModelOutput:
    """What the executor returns: the tokens each request that samples in this step kept (its
    accepted drafts and one token of the target's own), and the drafts proposed for the next."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list] = field(
        default_factory=dict
    )  # for requests that asked: one entry a token
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    draft_time: float = 0.0  # seconds of the step spent proposing them


@runtime_checkable
class Executor(Protocol):
    """What the engine runs a step on: the model runner (model/runner.py), the simulator (sim/executor.py)."""

    kind: str
    model_config: ModelConfig

    def execute(self, plan: StepPlan) -> ModelOutput: ...

    def forget(self, request_id: str) -> None:
        """Drop any state kept for a finished request."""

    def describe(self) -> dict:
        """model, backend, device, dtype, ... for the timeline's meta."""
