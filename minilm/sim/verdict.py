"""A run's SLO verdict, decided while it runs (the capacity search's early stop, search.py).

A capacity search asks of each run one question: did at least `target` (90%) of its requests
meet both SLO limits? The answer is often certain long before the run ends. A request has
certainly missed once its TTFT is past the limit while it still waits for its first token, or
once the time since its first token already makes its TPOT too long, whatever its remaining
tokens take; it has certainly met once it finished within both. When more than 1 - target of
the run's requests have certainly missed, or target of them have certainly met, the verdict
is known and the fleet stops (Fleet.loop). The test: every early verdict equals the verdict of
the same run run to its end (tests/test_capacity_search.py).

"Certainly" rests on the fleet's clock: every token not yet stamped comes from a step that
starts at or after `horizon` (the earliest next step or event), and ends no earlier. So for a
request still without its first token, TTFT >= horizon - arrival; for one with two tokens or
more, not finished, TPOT = (finish - first) / (output - 1) >= (horizon - first) / (max_tokens - 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..metrics import meets_slo
from ..timeline import RequestRecord
from ..workload import RequestSpec

# what a fleet knows of a request now: its first token's time (None: none yet), tokens so far
Progress = Callable[[str], tuple[float | None, int]]


@dataclass
class EarlyVerdict:
    """Counts a run's requests that have certainly met or missed the SLOs; `verdict` is True
    (attainment >= target), False, or None (not known yet)."""

    specs: list[RequestSpec]
    ttft_slo: float | None
    tpot_slo: float | None
    target: float = 0.9
    every: int = 32  # scan the requests in flight every this many checks (a check is a step)
    met: int = 0
    missed: int = 0
    verdict: bool | None = None
    stopped: bool = False  # the run stopped with requests still to serve
    arrived: int = 0  # of the specs in arrival order, those that had arrived by the last check
    open: dict[str, RequestSpec] = field(default_factory=dict)  # arrived, not yet decided
    decided: set[str] = field(default_factory=set)
    checks: int = 0

    def __post_init__(self) -> None:
        self.specs = sorted(self.specs, key=lambda s: s.arrival)
        self.total = len(self.specs)

    def served(self, record: RequestRecord) -> None:
        """A request's final record (as its client sees it)."""
        rid = record.request_id
        if rid in self.decided:
            return
        self.decided.add(rid)
        self.open.pop(rid, None)
        if meets_slo(record, self.ttft_slo, self.tpot_slo):
            self.met += 1
        else:
            self.missed += 1
        self.decide()

    def check(self, horizon: float, progress: Progress) -> bool:
        """True once the verdict is known (the run stops); every token still to come, and
        every request still to arrive, is at or after `horizon`."""
        if self.verdict is not None:
            self.stopped = True
            return True
        while self.arrived < self.total and self.specs[self.arrived].arrival <= horizon:
            s = self.specs[self.arrived]
            if s.id not in self.decided:
                self.open[s.id] = s
            self.arrived += 1
        self.checks += 1
        if self.checks % self.every == 0:
            for rid in [r for r, s in self.open.items() if self.missed_by(s, horizon, progress)]:
                del self.open[rid]
                self.decided.add(rid)
                self.missed += 1
            self.decide()
        self.stopped = self.verdict is not None
        return self.stopped

    def missed_by(self, s: RequestSpec, horizon: float, progress: Progress) -> bool:
        first, tokens = progress(s.id)
        if self.ttft_slo is not None:
            ttft = (horizon if first is None else first) - s.arrival
            if ttft > self.ttft_slo:  # a first token still to come comes after the horizon
                return True
        if self.tpot_slo is None or first is None or tokens < 2 or s.max_tokens < 2:
            return False
        return (horizon - first) / (s.max_tokens - 1) > self.tpot_slo

    def decide(self) -> None:
        # the same division slo_attainment makes: met / total, at best (total - missed) / total
        if self.met / self.total >= self.target:
            self.verdict = True
        elif (self.total - self.missed) / self.total < self.target:
            self.verdict = False

    @property
    def attainment(self) -> float:
        """The run's SLO attainment when it ran to its end; else the bound that decided it:
        at least this share met (verdict True), at most this share can meet (False)."""
        return self.met / self.total if self.verdict else (self.total - self.missed) / self.total
