"""One step's plan and its outputs (docs/DESIGN.md, "One step"): only values cross,
never a live `Request`, so a plan survives bytes and back (tests/test_plan_values.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .config import ModelConfig
from .request import SamplingParams


@dataclass(slots=True)
class NewRequest:
    """What an executor is told of a request when first scheduled (vLLM's NewRequestData)."""

    prompt_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None


@dataclass(slots=True)
class SeqWork:
    """One request's share of a step, positions `start : end` of its sequence: `token_ids`,
    its drafts (lesson 10), then `num_padding` dummy tokens (lesson 2)."""

    request_id: str
    token_ids: list[int]  # a prompt, a chunk, a recomputed sequence, the last token
    num_padding: int
    start: int  # position of the first new token
    block_table: list[int]  # the request's KV blocks for this step
    kind: str  # prefill | decode | padding
    samples: bool  # it computes the last known token, so it samples the next
    num_cached: int = 0  # tokens before `start` found in the prefix cache
    draft_token_ids: list[int] = field(default_factory=list)
    new: NewRequest | None = None  # the first time it is scheduled

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids) + len(self.draft_token_ids)

    @property
    def end(self) -> int:
        """Its context length once the step has run."""
        return self.start + self.num_new_tokens + self.num_padding


@dataclass
class StepPlan:
    """One step's work, and the engine's state as it runs."""

    work: list[SeqWork]
    preempted: list[str]  # request ids, back to the waiting queue
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_tokens_stored: int  # slots holding a token once it has run (drafts kept)
    block_tables: dict[str, list[int]] | None = None  # for the KV map
    cached_free_blocks: list[int] | None = None  # free, keeping a cached prefix

    @property
    def num_scheduled_tokens(self) -> int:
        """Every token the step computes, padding included."""
        return sum(w.num_new_tokens + w.num_padding for w in self.work)


@dataclass
class ModelOutput:
    """The tokens each request that samples kept (its accepted drafts, then one of the
    target's own), and drafts for the next step."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list] = field(default_factory=dict)  # one a token
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    draft_time: float = 0.0  # seconds of the step spent proposing them


@dataclass(slots=True)
class RequestOutput:
    """What a step changed of a request that sampled (vLLM's EngineCoreOutput)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # stop | length | aborted
    new_logprobs: list | None = None  # where asked: one a token
    num_accepted: int = 0  # drafts its verification kept (lesson 10)


@runtime_checkable
class Executor(Protocol):
    """What runs a step: the model runner, the simulator (sim/executor.py), or yours.
    Optional: `kv_num_blocks(config) -> int` sizes its own KV cache (the simulator's)."""

    kind: str
    model_config: ModelConfig
    speculates: bool  # proposes drafts: may take a speculative_config

    def execute(self, plan: StepPlan) -> ModelOutput: ...

    def forget(self, request_id: str) -> None:
        """Drop any state kept for a finished request."""

    def describe(self) -> dict:
        """model, backend, device, dtype, ... for the timeline's meta."""
