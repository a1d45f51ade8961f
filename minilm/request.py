"""A request and its life: pending (not yet arrived) -> waiting -> running -> finished.

Preemption sends a running request back to waiting (its KV freed and recomputed later,
its output kept). It ends in one place, `Scheduler.finish`: a stop token, its length or
an abort.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from .config import InvalidValue, check_int

TokenIds = list[int] | np.ndarray  # an array: a compact prompt (docs/SIMULATOR.md, "Memory")


def token_list(ids: TokenIds) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else ids


class Status(enum.Enum):
    PENDING = "pending"  # added, arrival time not reached
    WAITING = "waiting"  # in the queue
    RUNNING = "running"  # holds KV blocks, scheduled every step
    FINISHED = "finished"


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # no EOS or stop id before this many tokens
    logprobs: int | None = None  # return each token's log-probability and the top-N (None: none)

    def validate(self, request_id: str | None = None) -> None:
        check_int("max_tokens", self.max_tokens, 1, request_id=request_id)
        check_int("top_k", self.top_k, 0, "must be an integer >= 0 (0 turns it off)", request_id)
        check_int("min_tokens", self.min_tokens, 0, request_id=request_id)
        if self.min_tokens > self.max_tokens:
            raise InvalidValue(
                "min_tokens",
                self.min_tokens,
                f"must be <= max_tokens={self.max_tokens}",
                request_id,
            )
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, 0, "must be an integer >= 0 or None", request_id)
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise InvalidValue(
                "temperature", self.temperature, "must be a number >= 0 (0 is greedy)", request_id
            )
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise InvalidValue("top_p", self.top_p, "must be a number in (0, 1]", request_id)


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_ids: TokenIds
    params: SamplingParams
    arrival: float = 0.0
    eos_token_id: int | None = None
    status: Status = Status.PENDING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    finish_reason: str | None = None  # stop | length | aborted
    preemptions: int = 0
    t_scheduled: float | None = None
    t_first_token: float | None = None
    t_finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache when first admitted
    # the prefix-cache key of each full block (core/prefix_cache.py)
    block_keys: list[tuple] = field(default_factory=list)
    # with params.logprobs, one a token: [logprob, [[id, logprob], ...]]
    output_logprobs: list = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts to verify next (lesson 10)
    # record="aggregate"'s, in place of token_times (minilm/record.py)
    t_last_token: float | None = None
    worst_gap: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output so far (vLLM's meaning)."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_remaining(self) -> int:
        """Tokens still to compute before the next sample (1 for a decode)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def max_len(self) -> int:
        """The longest this request can grow: what `reserved` KV allocates up front."""
        return self.prompt_len + self.params.max_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def token_ids(self, start: int, n: int) -> TokenIds:
        """Tokens `start : start + n` of prompt + output, without building the sequence."""
        p = len(self.prompt_ids)
        if start + n <= p:
            return self.prompt_ids[start : start + n]
        if start >= p:
            return self.output_ids[start - p : start - p + n]
        return token_list(self.prompt_ids[start:]) + self.output_ids[: start + n - p]

    def append_output(self, token: int) -> str | None:
        """Add a sampled token; the reason to stop after it (EOS, a stop id, max_tokens) or None."""
        self.output_ids.append(token)
        p = self.params
        if (token == self.eos_token_id and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(self.output_ids) >= p.max_tokens:
            return "length"
        return None
