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
        self.keys: dict[str, int] = {}  # the other way
        self.sent: dict[int, int] = {}  # key -> output tokens handed over so far
        self.unsent: dict[int, Tokens] = {}  # key -> tokens held for --stream-interval
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
        self.keys[req.request_id] = cmd.key
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
        self.forget(key, rid)
        return [
            Tokens(key, [], finish_reason=reason),
            self.stats(None, [self.engine.requests[rid]]),
        ]

    def forget(self, key: int, rid: str) -> None:
        """A request that has finished: nothing more of it goes out."""
        self.request_ids.pop(key, None)
        del self.keys[rid], self.sent[key]
        self.unsent.pop(key, None)

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
        """One engine step; the new tokens (or the finish) of each request it changed, then
        the step's stats: work in proportion to the requests the step scheduled."""
        done = self.engine.step_outputs()
        record, outputs = done if done is not None else (None, [])
        events, finished = [], []
        for out in outputs:
            key = self.keys.get(out.request_id)
            if key is None:
                continue  # added to the engine by another way: not streamed
            logprobs = None if out.new_logprobs is None else []
            held = self.unsent.setdefault(key, Tokens(key, [], logprobs))
            held.token_ids += out.new_token_ids
            if logprobs is not None:
                held.logprobs += out.new_logprobs
            few = len(held.token_ids) < self.stream_interval
            if out.finish_reason is None and self.sent[key] and few:
                continue  # fewer than --stream-interval tokens (the first go at once)
            held.finish_reason = out.finish_reason
            events.append(self.unsent.pop(key))
            self.sent[key] += len(held.token_ids)
            if out.finish_reason is not None:
                finished.append(self.engine.requests[out.request_id])
                self.forget(key, out.request_id)
        return events + [self.stats(record, finished, outputs)]

    def stats(self, record: StepRecord | None, finished: list, outputs: list = ()) -> StepStats:
        """The step's numbers for /metrics, from its outputs: tokens sampled, first tokens,
        gaps (one per request and step, as vLLM's: tokens a step kept together come out
        together), finishes, gauges, drafts verified."""
        engine, new_tokens, prompt_tokens, ttfts, queue, itls = self.engine, 0, 0, [], [], []
        for out in outputs:
            req, n = engine.requests[out.request_id], len(out.new_token_ids)
            new_tokens += n
            if len(req.token_times) == n:  # its first token(s)
                ttfts.append(req.t_first_token - req.arrival)
                queue.append(req.t_scheduled - req.arrival)
                prompt_tokens += req.prompt_len
            else:
                itls.append(req.token_times[-n] - req.token_times[-n - 1])
        drafts = (
            [(i.num_draft, i.num_accepted) for i in record.items if i.num_draft] if record else []
        )
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
            engine.kv_manager.num_used_blocks,
            engine.kv_manager.num_blocks,
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
