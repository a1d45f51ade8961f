"""The engine's side of the server, whatever carries its messages (lesson 9).

    loop = EngineLoop(engine, max_waiting=1024, stream_interval=1, window=1000, timeline_path=None)
    events = loop.apply(command)     # between steps: Add, Abort, Snapshot, Drain
    events = loop.step()             # one engine step: each request's new tokens, and the step's stats
    loop.retire()                    # once the events are out: finished requests leave (history.py)

The engine is one loop and nothing in it is locked, so exactly one thread of one
process touches it: the engine thread of the in-process design (engine_thread.py) or
the engine-core process (engine_core.py). Both run this class; they differ only in how
commands reach it and events leave it.

Each accepted request gets exactly one Accepted, then Tokens events (every
`stream_interval` tokens, the first at once) until exactly one has a finish_reason:
none is lost, none finishes twice.
"""

from __future__ import annotations

import time

from ..config import InvalidValue
from ..core.engine import Engine, record_request
from ..timeline import StepRecord
from .history import DEFAULT_WINDOW, History
from .messages import (
    Abort,
    Accepted,
    Add,
    Command,
    Drain,
    Event,
    Rejected,
    Snapshot,
    SnapshotData,
    StepStats,
    Tokens,
)
from .public import public_view


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        max_waiting: int | None = None,
        stream_interval: int = 1,
        window: int | None = DEFAULT_WINDOW,
        timeline_path: str | None = None,
    ):
        """`max_waiting`: requests allowed to wait for a place in the batch; past it new ones get
        HTTP 429. `stream_interval`: hand over a request's tokens every N tokens (vLLM's flag).
        `window`, `timeline_path`: what is kept of the run, and where all of it goes (history.py)."""
        self.engine, self.max_waiting, self.stream_interval = engine, max_waiting, stream_interval
        self.history = History(engine, window, timeline_path)
        self.request_ids: dict[int, str] = {}  # key -> request id, unfinished requests only
        self.sent: dict[int, int] = {}  # key -> output tokens handed over so far
        self.draining_until: float | None = None

    # ---- commands ----------------------------------------------------------------------
    def apply(self, command: Command) -> list[Event]:
        if isinstance(command, Add):
            return [self.add(command)]
        if isinstance(command, Abort):
            return self.abort(command.key, command.reason)
        if isinstance(command, Snapshot):
            return [
                SnapshotData(command.key, self.snapshot(command.since_step, command.since_request))
            ]
        if isinstance(command, Drain):
            self.draining_until = time.monotonic() + command.timeout
        return []

    def add(self, cmd: Add) -> Event:
        engine = self.engine
        if self.draining_until is not None:
            return Rejected(
                cmd.key,
                503,
                "the server is shutting down",
                code="shutdown",
                type="service_unavailable",
            )
        if self.max_waiting is not None and engine.num_waiting >= self.max_waiting:
            return Rejected(
                cmd.key,
                429,
                f"{engine.num_waiting} requests are already waiting (--max-waiting "
                f"{self.max_waiting}); retry later",
                code="queue_full",
                type="rate_limit_exceeded",
            )
        try:  # the engine's own checks: nothing is added when one fails
            req = engine.add_request(
                cmd.request_id,
                cmd.prompt_ids,
                max_tokens=cmd.max_tokens,
                arrival=self.arrival(cmd.arrival),
                **cmd.sampling,
            )
        except InvalidValue as e:
            return Rejected(cmd.key, 400, str(e), e.name, e.code)
        self.request_ids[cmd.key], self.sent[cmd.key] = req.request_id, 0
        return Accepted(cmd.key, req.prompt_len)

    def arrival(self, perf_counter: float) -> float:
        """When the HTTP request came, on the engine's clock: a server's clock is the wall's
        (perf_counter, the same in every process of the machine); another clock (the tests'
        hand-stepped engines) takes it as now."""
        origin = getattr(self.engine.clock, "origin", None)
        return self.engine.clock.now if origin is None else max(0.0, perf_counter - origin)

    def abort(self, key: int, reason: str = "aborted") -> list[Event]:
        """Stop a request now: its KV freed before the next step, the timeline records `reason`."""
        rid = self.request_ids.pop(key, None)
        if rid is None or not self.engine.abort(rid, reason):  # finished already, or never accepted
            return []
        self.sent.pop(key)
        return [
            Tokens(key, [], finish_reason=reason),
            self.stats(None, [self.engine.requests[rid]]),
        ]

    def abort_all(self) -> list[Event]:
        return [e for key in list(self.request_ids) for e in self.abort(key)]

    def drain_due(self) -> bool:
        """Shutting down, the grace period is over, and requests are still in flight."""
        return (
            self.draining_until is not None
            and time.monotonic() >= self.draining_until
            and bool(self.request_ids)
        )

    # ---- one step ------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """One engine step; every request's new tokens (or its finish), then the step's stats."""
        record = self.engine.step()
        events, finished = [], []
        for key, rid in list(self.request_ids.items()):
            req = self.engine.requests[rid]
            new = len(req.output_ids) - self.sent[key]
            if not req.finished and (not new or (self.sent[key] and new < self.stream_interval)):
                continue  # nothing sampled yet (a prompt chunk), or fewer tokens than --stream-interval
            events.append(
                Tokens(
                    key,
                    req.output_ids[self.sent[key] :],
                    req.output_logprobs[self.sent[key] :]
                    if req.params.logprobs is not None
                    else None,
                    req.finish_reason if req.finished else None,
                )
            )
            self.sent[key] = len(req.output_ids)
            if req.finished:
                finished.append(req)
                del self.request_ids[key], self.sent[key]
        return events + [self.stats(record, finished)]

    def stats(self, record: StepRecord | None, finished: list) -> StepStats:
        """The step's numbers for /metrics: tokens sampled, first tokens, gaps (one per request and step,
        as vLLM's: tokens a step kept together come out together), finishes, gauges, drafts verified."""
        engine, new_tokens, prompt_tokens, ttfts, queue, itls, drafts = (
            self.engine,
            0,
            0,
            [],
            [],
            [],
            [],
        )
        if record is not None:
            drafts = [(i.num_draft, i.num_accepted) for i in record.items if i.num_draft]
            for rid in dict.fromkeys(
                i.request_id for i in record.items if i.kind in ("prefill", "decode")
            ):
                req = engine.requests[rid]
                times = [t for t in req.token_times if t == record.t_end]  # sampled in this step
                new_tokens += len(times)
                if times and len(req.token_times) == len(times):  # its first token(s)
                    ttfts.append(req.t_first_token - req.arrival)
                    queue.append(req.t_scheduled - req.arrival)
                    prompt_tokens += req.prompt_len
                elif times:
                    itls.append(req.token_times[-len(times)] - req.token_times[-len(times) - 1])
        return StepStats(
            new_tokens,
            prompt_tokens,
            ttfts,
            queue,
            itls,
            [(r.finish_reason, r.t_finished - r.arrival) for r in finished],
            record.num_preempted if record is not None else 0,
            engine.num_running,
            engine.num_waiting,
            engine.kv_usage,
            drafts,
        )

    def retire(self) -> None:
        """Once a step's (or a command's) events are out: the requests they finished leave the
        engine, the new records go to `--timeline FILE`, the oldest leave the window (history.py)."""
        self.history.update()

    def snapshot(self, since_step: int, since_request: int) -> dict:
        """Timeline records from the cursors on (those the window still holds), and the unfinished
        requests as they are now (the live Gantt), in their public view (public.py `public_view`):
        no token ids leave the engine this way. The whole run, tokens and block tables included,
        is in `--timeline FILE`."""
        steps, requests = self.history.since(since_step, since_request)
        unfinished = [
            public_view(record_request(self.engine.requests[rid]))
            for rid in self.request_ids.values()
        ]
        return {
            "meta": self.engine.timeline.meta,
            "now": self.engine.clock.now,
            "steps": [public_view(s) for s in steps],
            "requests": [public_view(r) for r in requests],
            "unfinished": unfinished,
            "next_step": self.history.next_step,
            "next_request": self.history.next_request,
            "window": self.history.window,
        }
