"""The timeline: one record per engine step and per request, all that metrics and widgets
read, the same for a measured run on a laptop and a simulated 70B model on an H100.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ITEM_KINDS = ("prefill", "decode", "padding")  # tokens a step computes
CACHED = "cached"  # prompt tokens found in the prefix cache when admitted: no compute

# Requests a benchmark client saw fail (lesson 9), marked by finish_reason (RequestRecord.error
# says why): the metrics count them apart from every latency; the Gantt marks them.
ERROR = "error"  # no token came: refused, an HTTP error, a stream broken before its first
INCOMPLETE = "incomplete"  # it stopped after some tokens: a broken stream, a timeout
FAILED = (ERROR, INCOMPLETE)


@dataclass(slots=True)
class StepItem:
    request_id: str
    kind: str  # prefill | decode | padding | cached
    num_tokens: int
    context_len: int  # the sequence's context after this item (its verified tokens)
    num_draft: int = 0  # of num_tokens, drafts the step verified (lesson 10)
    num_accepted: int = 0  # of those, drafts the target agreed with


@dataclass
class StepRecord:
    step: int
    t_start: float
    t_end: float
    items: list[StepItem]
    num_running: int
    num_waiting: int
    kv_blocks_used: int  # blocks held by some request (a block in several tables once)
    kv_blocks_total: int
    num_preempted: int
    kv_tokens_stored: int = 0  # of their slots, those holding a token after the step
    kv_blocks: dict[str, list[int]] | None = None  # block table of each request, when recorded
    model_time: float = 0.0  # seconds in the model and sampling; the rest is the engine's
    kv_cached_free: list[int] | None = None  # blocks nobody holds that keep a cached prefix
    draft_time: float = 0.0  # of model_time, seconds proposing the next step's drafts

    @property
    def duration(self) -> float:
        return self.t_end - self.t_start

    def bulk_decodes(self) -> tuple[int, list[StepItem]]:
        """(n, rest): items are n one-token decodes, then rest (n > 0: sim's DecodeStep)."""
        return 0, self.items

    def tokens(self, kind: str | None = None) -> int:
        """Tokens of one kind, or (None) every token the step computed."""
        return sum(
            i.num_tokens
            for i in self.items
            if i.kind == kind or (kind is None and i.kind != CACHED)
        )


@dataclass
class RequestRecord:
    request_id: str
    arrival: float
    prompt_len: int
    max_tokens: int
    t_scheduled: float | None
    t_first_token: float | None
    token_times: list[float]
    t_finished: float | None
    output_len: int
    finish_reason: str | None
    preemptions: int
    output_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    error: str = ""  # why it failed (finish_reason in FAILED), as the client reported it
    worst_gap: float | None = None  # record="aggregate"'s, token_times empty

    @property
    def failed(self) -> bool:
        return self.finish_reason in FAILED


@dataclass
class Timeline:
    steps: list[StepRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # policy, model, clock, knobs
    other_gaps: list[float] = field(default_factory=list)  # record="aggregate"'s

    # ---- JSON ----
    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "steps": [asdict(s) for s in self.steps],
            "requests": [asdict(r) for r in self.requests],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        steps = [
            StepRecord(**{**s, "items": [StepItem(**i) for i in s["items"]]}) for s in d["steps"]
        ]
        return cls(steps, [RequestRecord(**r) for r in d["requests"]], d.get("meta", {}))

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict())
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Timeline:
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        return cls.from_dict(json.loads(p.read_text() if p else text_or_path))
