"""The HTTP side's handle on the engine, whichever design runs it (lesson 9).

    client = ProcessEngineClient(...) or ThreadEngineClient(...)   # engine_core.py, engine_thread.py
    await client.start()
    stream = client.add(request_id, request, arrival, "10.0.0.7")   # then: await stream.queue.get() -> events
    client.in_flight["10.0.0.7"]                          # that client's requests not finished yet
    client.abort(stream)                                  # the client went away: free its KV now
    data = await client.snapshot(since_step, since_request)

A design only says how commands reach the engine (`send`) and hands every event that
comes back to `dispatch`, in the event loop's thread: `dispatch` routes a request's
events to its stream's queue, the step's numbers to the Prometheus metrics, a snapshot
to whoever asked for it. If the engine dies, every stream still open ends with an error
event and new requests are refused at once (503): nothing waits forever.

`in_flight` counts each client address's requests from `add` to their last event (their
finish, the abort that follows a disconnect, a refusal, the engine's death), so a count
falls back however a request ends (`--max-inflight-per-client`, server.py).
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

from .messages import (
    Abort,
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
from .metrics import ServerMetrics
from .openai_api import GenerateRequest


@dataclass
class RequestStream:
    """One request's end on the HTTP side: its events arrive on `queue`."""

    key: int
    request_id: str
    client: str = ""  # the HTTP client's address
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


@dataclass
class EngineInfo:
    """What the HTTP side needs to know of the engine (it never touches the engine itself)."""

    meta: dict  # the timeline's meta: model, policy, knobs
    max_model_len: int


class EngineClient(ABC):
    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.streams: dict[int, RequestStream] = {}
        self.in_flight: Counter[str] = Counter()  # client address -> its streams still open
        self.snapshots: dict[int, asyncio.Future] = {}
        self.keys = itertools.count()
        self.info: EngineInfo | None = None  # set once the engine is ready
        self.error: str | None = None  # why the engine stopped, if it did
        self.draining = False

    # ---- what a design provides ---------------------------------------------------------
    @abstractmethod
    async def start(self) -> None:
        """Start the engine; returns once it is ready (`info` set)."""

    @abstractmethod
    async def stop(self) -> None:
        """Abort what is left, stop the engine, complete its timeline file if one was asked for."""

    @abstractmethod
    def send(self, command: Command) -> None:
        """Hand a command to the engine (applied between two steps)."""

    # ---- what the HTTP side calls ---------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.error is None and not self.draining

    def add(
        self, request_id: str, req: GenerateRequest, arrival: float, client: str = ""
    ) -> RequestStream:
        stream = RequestStream(next(self.keys), request_id, client)
        if self.error is not None:
            stream.queue.put_nowait(
                Rejected(
                    stream.key,
                    503,
                    f"the engine is not running ({self.error})",
                    type="service_unavailable",
                )
            )
            return stream
        self.streams[stream.key] = stream
        self.in_flight[client] += 1
        self.send(
            Add(stream.key, request_id, req.prompt_ids, req.max_tokens, req.sampling, arrival)
        )
        return stream

    def abort(self, stream: RequestStream, reason: str = "aborted") -> None:
        if stream.key in self.streams and self.error is None:
            self.send(Abort(stream.key, reason))

    async def snapshot(self, since_step: int, since_request: int) -> dict:
        key = next(self.keys)
        self.snapshots[key] = future = asyncio.get_running_loop().create_future()
        self.send(Snapshot(key, since_step, since_request))
        return await future

    def drain(self, timeout: float) -> None:
        """Stop taking requests (503); those in flight may finish for `timeout` seconds."""
        self.draining = True
        self.send(Drain(timeout))

    # ---- events, in the event loop's thread -------------------------------------------------
    def dispatch(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, StepStats):
                self.metrics.observe(event)
            elif isinstance(event, SnapshotData):
                future = self.snapshots.pop(event.key, None)
                if future is not None and not future.done():
                    future.set_result(event.data)
            else:
                stream = self.streams.get(event.key)
                if stream is None:
                    continue
                if isinstance(event, Rejected) or (
                    isinstance(event, Tokens) and event.finish_reason is not None
                ):
                    self.close(stream)  # its last event
                stream.queue.put_nowait(event)

    def close(self, stream: RequestStream) -> None:
        del self.streams[stream.key]
        self.in_flight[stream.client] -= 1
        if not self.in_flight[stream.client]:
            del self.in_flight[stream.client]

    def fail_all(self, error: str) -> None:
        """The engine stopped: every open stream ends with an error, every snapshot with nothing."""
        self.error = error
        for stream in self.streams.values():
            stream.queue.put_nowait(
                Rejected(stream.key, 500, f"the engine stopped: {error}", type="internal_error")
            )
        self.streams.clear()
        self.in_flight.clear()
        for future in self.snapshots.values():
            if not future.done():
                future.set_result({})
        self.snapshots.clear()
