"""One engine, one thread: how a server drives the single-threaded engine (lesson 9).

The engine is one loop (engine.py) and nothing in it is locked, so exactly one thread
may touch it. HTTP handlers run in another thread (the asyncio event loop) and talk to
this one through two one-way channels:

    commands  handler -> engine thread: add a request, abort one, take a timeline snapshot.
              A list under a condition variable; the engine thread applies them *between*
              steps, so a step never sees a half-added request. With nothing to do, the
              thread sleeps on the condition (no busy waiting) until a command comes.
    events    engine thread -> handler: each request's new tokens after every step (or every
              `stream_interval` tokens), on the request's own asyncio.Queue. asyncio objects are not thread-safe, so the
              thread hands a step's events to the event loop in one `call_soon_threadsafe`.

    handler:  stream = engine_thread.add(request_id, request, arrival)
              event = await stream.queue.get()   # Accepted, Rejected, then Tokens ... (finish_reason set)

The two threads share one interpreter lock (the GIL): only one runs Python at a time.
The model's tensor operations release it, but a small model's step is mostly Python, so
the HTTP side's work adds to the engine's more than it runs beside it; the README's
"Serving: what HTTP costs" (bench/serve_overhead.py) measures by how much. vLLM puts its
engine in a process of its own for this reason; the lab keeps one process, for clarity.

A request's arrival is the moment its HTTP request came (the engine's WallClock), not
when the thread picked it up, so its TTFT includes any wait for the current step.
Each request gets exactly one Accepted or Rejected and, once accepted, Tokens events
until exactly one has a finish_reason: none is lost, none finishes twice.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..config import InvalidValue
from ..core.engine import Engine, record_request
from .openai_api import APIError, GenerateRequest, engine_error


@dataclass
class Accepted:
    prompt_len: int


@dataclass
class Rejected:
    error: APIError


@dataclass
class Tokens:
    token_ids: list[int]
    finish_reason: str | None = None  # the engine's: stop | length | aborted


@dataclass
class RequestStream:
    """The handler's end of one request: events arrive on `queue` (in the event loop's thread)."""

    request_id: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: int = 0           # output tokens handed over so far (engine thread only)


@dataclass
class Add:
    stream: RequestStream
    request: GenerateRequest
    arrival: float


@dataclass
class Abort:
    stream: RequestStream  # the stream, not just its id: a refused duplicate id must not abort the original


@dataclass
class Snapshot:
    since_step: int
    since_request: int
    done: Callable[[dict], None]


class EngineThread:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, max_waiting: int | None = None,
                 metrics=None, stream_interval: int = 1):
        """`max_waiting`: requests allowed to wait for a place in the batch; past it, new ones
        get HTTP 429. `metrics` (server_metrics.ServerMetrics) is updated in this thread after
        each step and each abort."""
        self.engine, self.loop, self.max_waiting, self.metrics = engine, loop, max_waiting, metrics
        self.stream_interval = stream_interval
        self.cond = threading.Condition()
        self.commands: list = []
        self.streams: dict[str, RequestStream] = {}  # unfinished requests (engine thread only)
        self.draining_until: float | None = None     # shutting down: no new requests; abort the rest then
        self.stopping = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, name="minilm-engine", daemon=True)

    # ---- called from the HTTP side (any thread) -----------------------------------------
    def start(self) -> None:
        self.thread.start()

    def send(self, command) -> None:
        with self.cond:
            self.commands.append(command)
            self.cond.notify()

    def add(self, request_id: str, request: GenerateRequest, arrival: float) -> RequestStream:
        stream = RequestStream(request_id)
        self.send(Add(stream, request, arrival))
        return stream

    def abort(self, stream: RequestStream) -> None:
        self.send(Abort(stream))

    def drain(self, timeout: float) -> None:
        """Stop taking requests (503); those in flight may finish for `timeout` seconds, then are aborted."""
        with self.cond:
            self.draining_until = time.monotonic() + timeout
            self.cond.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Abort whatever is left and end the thread (after `drain`, or at once)."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.draining_until is None

    # ---- the engine thread ----------------------------------------------------------
    def run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self.cond:
                    while not (self.commands or engine.has_unfinished() or self.stopping or self.drain_due()):
                        self.cond.wait(self.wait_timeout())
                    commands, self.commands = self.commands, []
                for command in commands:
                    self.apply(command)
                if self.stopping or self.drain_due():
                    self.abort_all()
                if self.stopping:
                    return
                if engine.has_unfinished():
                    self.publish(engine.step())
        except BaseException as e:  # the engine broke: every waiting handler must hear of it
            self.error = e
            self.fail_all(e)
            raise

    def drain_due(self) -> bool:
        """Shutting down, the grace period is over, and requests are still in flight."""
        return self.draining_until is not None and time.monotonic() >= self.draining_until and bool(self.streams)

    def wait_timeout(self) -> float | None:
        """Sleep until woken by a command, or until the grace period of a shutdown ends."""
        if self.draining_until is None or time.monotonic() >= self.draining_until:
            return None
        return self.draining_until - time.monotonic()

    def apply(self, command) -> None:
        engine = self.engine
        if isinstance(command, Add):
            req, stream = command.request, command.stream
            if self.draining_until is not None or self.stopping:
                return self.deliver([(stream, Rejected(APIError(503, "the server is shutting down", code="shutdown",
                                                                type="service_unavailable")))])
            waiting = engine.num_waiting
            if self.max_waiting is not None and waiting >= self.max_waiting:
                return self.deliver([(stream, Rejected(APIError(
                    429, f"{waiting} requests are already waiting (--max-waiting {self.max_waiting}); retry later",
                    code="queue_full", type="rate_limit_exceeded")))])
            try:
                added = engine.add_request(stream.request_id, req.prompt_ids, max_tokens=req.max_tokens,
                                           arrival=command.arrival, **req.sampling)
            except InvalidValue as e:  # the engine's own checks: nothing was added
                return self.deliver([(stream, Rejected(engine_error(e, req)))])
            self.streams[stream.request_id] = stream
            self.deliver([(stream, Accepted(added.prompt_len))])
        elif isinstance(command, Abort):
            stream = command.stream
            if self.streams.get(stream.request_id) is stream:  # still running, and it is this one
                del self.streams[stream.request_id]
                if self.abort_request(stream.request_id):
                    self.deliver([(stream, Tokens([], "aborted"))])
        elif isinstance(command, Snapshot):
            command.done(self.snapshot(command.since_step, command.since_request))

    def abort_all(self) -> None:
        events = []
        for rid, stream in list(self.streams.items()):
            if self.abort_request(rid):
                events.append((stream, Tokens([], "aborted")))
        self.streams.clear()
        self.deliver(events)

    def abort_request(self, request_id: str) -> bool:
        """engine.abort: its KV freed now, the timeline records it as aborted."""
        if not self.engine.abort(request_id):
            return False
        if self.metrics is not None:
            self.metrics.finished(self.engine.requests[request_id])
            self.metrics.update_gauges(self.engine)
        return True

    def publish(self, record) -> None:
        """Hand every request of the step its new tokens; a finished request leaves `streams`."""
        events, finished = [], []
        for rid in dict.fromkeys(item.request_id for item in record.items):
            stream = self.streams.get(rid)
            if stream is None:  # a finished row of a static batch, computing padding
                continue
            req = self.engine.requests[rid]
            new = req.output_ids[stream.sent:]
            if not req.finished and (not new or (stream.sent and len(new) < self.stream_interval)):
                continue  # nothing sampled yet (a prompt chunk), or fewer tokens than --stream-interval
            stream.sent = len(req.output_ids)
            events.append((stream, Tokens(new, req.finish_reason if req.finished else None)))
            if req.finished:
                finished.append(req)
                del self.streams[rid]
        if self.metrics is not None:
            self.metrics.observe_step(self.engine, record, finished)
        self.deliver(events)

    def deliver(self, events: list[tuple[RequestStream, Any]]) -> None:
        """Hand events to the event loop's thread: one wake-up for a whole step's events."""
        if events:
            self.loop.call_soon_threadsafe(put_all, events)

    def fail_all(self, error: BaseException) -> None:
        events = [(s, Rejected(APIError(500, f"the engine stopped: {error!r}", type="internal_error")))
                  for s in self.streams.values()]
        self.streams.clear()
        with self.cond:
            for c in self.commands:
                if isinstance(c, Add):
                    events.append((c.stream, Rejected(APIError(503, "the engine stopped", type="internal_error"))))
                elif isinstance(c, Snapshot):
                    c.done({})
            self.commands.clear()
        self.deliver(events)

    def snapshot(self, since_step: int, since_request: int) -> dict:
        """New timeline records as JSON-ready dicts, and the unfinished requests as they are now
        (the live Gantt). Block tables are left out: the whole run's are in `--timeline`."""
        tl = self.engine.timeline
        steps = [step_dict(s) for s in tl.steps[since_step:]]
        unfinished = [asdict(record_request(self.engine.requests[rid])) for rid in self.streams]
        return {"meta": tl.meta, "now": self.engine.clock.now, "steps": steps,
                "requests": [asdict(r) for r in tl.requests[since_request:]], "unfinished": unfinished,
                "next_step": len(tl.steps), "next_request": len(tl.requests)}


def step_dict(s) -> dict:
    """A step record as JSON, without its block tables."""
    d = {k: v for k, v in vars(s).items() if k not in ("kv_blocks", "kv_cached_free")}
    d["items"] = [{"request_id": i.request_id, "kind": i.kind, "num_tokens": i.num_tokens,
                   "context_len": i.context_len} for i in s.items]
    return d


def put_all(events: list[tuple[RequestStream, Any]]) -> None:
    """In the event loop's thread: each event onto its request's queue."""
    for stream, event in events:
        stream.queue.put_nowait(event)
