"""What a timeline keeps with `record="aggregate"` (EngineConfig.record): totals, not items.

A full timeline holds a `StepItem` for every request in every step and every token's time:
at a million simulated requests, gigabytes. The aggregate record keeps what `summarize`
reads and no more (docs/SIMULATOR.md, "Memory"):

* each step as an `AggregateStep`: its `StepTotals` (tokens by kind, batch size, drafts)
  beside the `StepRecord`'s numbers;
* each request's `RequestRecord` without token times or output ids, with its `worst_gap`;
* the inter-token gaps as counts: most tokens follow a token of the step before, so their
  gap is the step's own (its t_end - the previous step's t_end): a step's `num_follow`
  counts them; the few others (after a preemption, a skipped step, a step's second token
  and on) are listed in `Timeline.other_gaps`.

`metrics.summarize` gives the same figures from either record, the ITL percentiles too (a
weighted percentile equal to np.percentile's). The engine forgets a finished request, its id
kept (`Engine.finished_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .request import Request
from .timeline import CACHED, StepItem, StepRecord, Timeline

AGGREGATE = "aggregate"  # EngineConfig.record's value


@dataclass(slots=True)
class StepTotals:
    """One step's tokens by kind, its batch size and drafts: what `summarize` reads of its
    items, counted once (an `AggregateStep` keeps these instead of the items)."""

    prefill: int = 0
    decode: int = 0
    padding: int = 0
    cached: int = 0
    batch_size: int = 0  # requests doing real (non-padding) work
    num_draft: int = 0  # drafts verified (lesson 10)
    num_accepted: int = 0
    num_verifies: int = 0  # decodes that verified drafts

    @classmethod
    def of(cls, num_decodes: int, items: list[StepItem]) -> StepTotals:
        """`num_decodes` one-token decodes (a simulated step's lanes), then `items`."""
        t, real = cls(decode=num_decodes), set()
        for i in items:
            if i.num_draft:  # a decode that verified drafts
                t.num_draft += i.num_draft
                t.num_accepted += i.num_accepted
                t.num_verifies += 1
            if i.kind == CACHED:
                t.cached += i.num_tokens
                continue
            setattr(t, i.kind, getattr(t, i.kind) + i.num_tokens)
            if i.kind != "padding":
                real.add(i.request_id)
        t.batch_size = num_decodes + len(real)
        return t


class AggregateStep(StepRecord):
    """A `StepRecord` kept as totals (EngineConfig.record="aggregate"): every field but
    `items`, its `StepTotals`, and `num_follow`, its sampled tokens whose previous token came
    in the previous step (their gap is this step's t_end - the previous step's t_end: most of
    a run's inter-token gaps, counted instead of listed)."""

    def __init__(self, record: dict, totals: StepTotals, num_follow: int):
        self.__dict__.update(record)  # every StepRecord field but items
        self.sums, self.num_follow = totals, num_follow

    @classmethod
    def of(cls, record: StepRecord, num_decodes: int = 0, num_follow: int = 0) -> AggregateStep:
        """A full record's totals, `num_decodes` more one-token decodes counted in."""
        values = {f.name: getattr(record, f.name) for f in fields(StepRecord) if f.name != "items"}
        return cls(values, StepTotals.of(num_decodes, record.items), num_follow)

    @property
    def items(self) -> list[StepItem]:
        raise ValueError(
            "this timeline was recorded with record='aggregate' (EngineConfig.record): its steps "
            "keep totals (AggregateStep.sums), not one StepItem per request; rerun with "
            "record='full' for a view of the items"
        )

    def tokens(self, kind: str | None = None) -> int:
        t = self.sums
        return t.prefill + t.decode + t.padding if kind is None else getattr(t, kind)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AggregateStep):
            return NotImplemented
        values = [f.name for f in fields(StepRecord) if f.name != "items"] + ["sums", "num_follow"]
        return all(getattr(self, k) == getattr(other, k) for k in values)

    __hash__ = None


def note_gaps(
    tl: Timeline, req: Request, num_tokens: int, t_end: float, t_prev: float | None
) -> int:
    """A request's `num_tokens` new tokens at `t_end` (the step before ended at `t_prev`), as
    their gaps: 1 if the first one's is the step's own (its previous token came at t_prev),
    counted by the step; else it joins the timeline's other_gaps, as the rest (0.0) do."""
    zeros = [0.0] * (num_tokens - 1)  # its second token and on came with the first
    tl.other_gaps += zeros
    gaps, follows = zeros, 0
    if req.t_last_token is not None:
        gap, follows = t_end - req.t_last_token, int(req.t_last_token == t_prev)
        if not follows:
            tl.other_gaps.append(gap)
        gaps = [gap, *zeros]
    if gaps:
        req.worst_gap = max(gaps if req.worst_gap is None else [req.worst_gap, *gaps])
    req.t_last_token = t_end
    return follows
