"""A request and its life: pending (not yet arrived) -> waiting -> running -> finished.

A running request can go back to waiting when it is preempted (its KV blocks are
freed and recomputed later; its output so far is kept). The engine never forgets a
request and finishes each one exactly once.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.Enum):
    PENDING = "pending"   # added, arrival time not reached
    WAITING = "waiting"   # in the queue
    RUNNING = "running"   # holds KV blocks, scheduled every step
    FINISHED = "finished"


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0            # 0: off
    top_p: float = 1.0        # 1: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 turns it off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = 0.0
    eos_token_id: int | None = None
    status: Status = Status.PENDING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    finish_reason: str | None = None
    preemptions: int = 0
    t_scheduled: float | None = None
    t_first_token: float | None = None
    t_finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache when first admitted
    block_keys: list[tuple] = field(default_factory=list)  # prefix-cache key of each full block (prefix_cache.py)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output so far: the sequence the model must have seen to sample next."""
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

    def token_ids(self, start: int, n: int) -> list[int]:
        """Tokens `start : start + n` of prompt + output (without building the whole sequence)."""
        p = len(self.prompt_ids)
        if start + n <= p:
            return self.prompt_ids[start:start + n]
        if start >= p:
            return self.output_ids[start - p:start - p + n]
        return self.prompt_ids[start:] + self.output_ids[:start + n - p]

    def append_token(self, token: int) -> None:
        """Add a sampled token and apply the stop rules: EOS, stop ids, max_tokens."""
        self.output_ids.append(token)
        p = self.params
        if token == self.eos_token_id and not p.ignore_eos:
            self.finish_reason = "stop"
        elif token in p.stop_token_ids:
            self.finish_reason = "stop"
        elif len(self.output_ids) >= p.max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self.status = Status.FINISHED
