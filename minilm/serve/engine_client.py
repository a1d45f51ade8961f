"""The HTTP side's handle on the engine cores, whichever design runs them (lesson 9).

    client = ProcessEngineClient(...) or ThreadEngineClient(...)   # engine_core.py, engine_thread.py
    await client.start()
    core = client.place(["r1"], prompt_ids)                # which engine core serves the request
    stream = client.add("r1", request, arrival, "10.0.0.7", core)  # then: await stream.queue.get()
    client.in_flight["10.0.0.7"]                          # that client's requests not finished yet
    client.abort(stream)                                  # the client went away: free its KV now
    data = await client.snapshot(since_step, since_request, engine=0)

A design only says how commands reach an engine core (`send`) and hands every event that
comes back to `dispatch`, in the event loop's thread: `dispatch` routes a request's
events to its stream's queue, the step's numbers to the Prometheus metrics (labelled with
the core, as vLLM's `engine` label), a snapshot to whoever asked for it.

With `--data-parallel-size N` there are N engine cores, each its own engine (model copy,
scheduler, KV cache), behind this one client: vLLM's data parallelism. `place` asks the
router (minilm/router.py) which core takes a new request, from what this side knows of
each: its requests in flight (counted here, from `add` to their last event), its KV blocks
in use (reported with each step's outputs, `StepStats`) and the prompts sent there before
(`RoutedPrefixes`, for `prefix_aware`). A request id in flight on a core sends a request of
the same id to that core, whose engine refuses the duplicate: ids stay unique across cores.
Stream keys come from one counter, so they are unique across cores too.

If a core dies, its streams still open end with an error event and the router stops
choosing it; the other cores go on serving. Once none is left, new requests are refused at
once (503): nothing waits forever.

`in_flight` counts each client address's requests from `add` to their last event (their
finish, the abort that follows a disconnect, a refusal, the core's death), so a count
falls back however a request ends (`--max-inflight-per-client`, server.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..router import ReplicaLoad, Route, RoutedPrefixes, RouterPolicy, make_router, route
from .history import DEFAULT_WINDOW
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
    core: int = 0  # the engine core serving it
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


@dataclass
class EngineInfo:
    """What the HTTP side needs to know of the engine (it never touches the engine itself)."""

    meta: dict  # the timeline's meta: model, policy, knobs
    max_model_len: int


@dataclass
class Core:
    """What the HTTP side knows of one engine core: what the router reads, and whether it runs."""

    outstanding: int = 0  # its streams still open
    kv_blocks_used: int = 0  # as of its last step's stats
    kv_blocks_total: int = 0
    max_num_seqs: int = 0  # its seats, from its knobs at start
    error: str | None = None  # why it stopped, if it did


def load(core: Core) -> ReplicaLoad:
    return ReplicaLoad(
        core.outstanding, core.kv_blocks_used, core.kv_blocks_total, core.max_num_seqs
    )


class EngineClient(ABC):
    def __init__(
        self,
        metrics: ServerMetrics,
        data_parallel_size: int = 1,
        router: str | RouterPolicy = "least_outstanding",
    ):
        self.metrics = metrics
        self.cores = [Core() for _ in range(data_parallel_size)]
        self.router = make_router(router)
        self.prefixes: list[RoutedPrefixes] = []  # per core, once `info` gives the block size
        self.routes: deque[Route] = deque(maxlen=DEFAULT_WINDOW)  # the router's last decisions
        self.streams: dict[int, RequestStream] = {}
        self.in_flight: Counter[str] = Counter()  # client address -> its streams still open
        self.placed: dict[str, tuple[int, int]] = {}  # request id -> (its core, its open streams)
        self.snapshots: dict[int, tuple[asyncio.Future, int]] = {}  # key -> (future, core)
        self.keys = itertools.count()
        self.info: EngineInfo | None = None  # set once the engine cores are ready
        self.draining = False

    # ---- what a design provides ---------------------------------------------------------
    @abstractmethod
    async def start(self) -> None:
        """Start the engine; returns once it is ready (`info` set)."""

    @abstractmethod
    async def stop(self) -> None:
        """Abort what is left, stop the engine, complete its timeline file if one was asked for."""

    @abstractmethod
    def send(self, command: Command, core: int = 0) -> None:
        """Hand a command to engine core `core` (applied between two of its steps)."""

    def ready(self, info: EngineInfo) -> None:
        """The cores are up (alike: the first one's info stands for all)."""
        self.info = info
        for core in self.cores:
            core.max_num_seqs = info.meta["max_num_seqs"]
        self.prefixes = [RoutedPrefixes(info.meta["block_size"]) for _ in self.cores]

    # ---- what the HTTP side calls ---------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        """The engine cores /timeline and /metrics show apart."""
        return len(self.cores)

    def label(self, core: int) -> str:
        """Core `core`'s `engine` label in /metrics."""
        return str(core)

    @property
    def error(self) -> str | None:
        """Why the engine stopped, once no core is left (None while one runs)."""
        if any(c.error is None for c in self.cores):
            return None
        return "; ".join(dict.fromkeys(c.error for c in self.cores))

    @property
    def alive(self) -> bool:
        return self.error is None and not self.draining

    def place(self, request_ids: Sequence[str], prompt_ids: Sequence[int]) -> int:
        """The core for a new request and its n choices (they share the prompt's KV there): the
        core where one of these ids is in flight (its engine refuses the duplicate), else the
        router's choice among the cores still running."""
        for rid in request_ids:
            if rid in self.placed:
                return self.placed[rid][0]
        live = [i for i, c in enumerate(self.cores) if c.error is None]
        if len(live) <= 1:
            return live[0] if live else 0
        decision = route(
            self.router,
            request_ids[0],
            time.perf_counter(),
            prompt_ids,
            [load(self.cores[i]) for i in live],
            lambda j, prompt: self.prefixes[live[j]].match(prompt),
            [f"engine {i}" for i in live],
        )
        core = live[decision.replica]
        self.routes.append(replace(decision, replica=core))
        return core

    def add(
        self,
        request_id: str,
        req: GenerateRequest,
        arrival: float,
        client: str = "",
        core: int = 0,
    ) -> RequestStream:
        stream = RequestStream(next(self.keys), request_id, client, core)
        error = self.cores[core].error
        if error is not None:
            stream.queue.put_nowait(
                Rejected(
                    stream.key,
                    503,
                    f"the engine is not running ({error})",
                    type="service_unavailable",
                )
            )
            return stream
        self.streams[stream.key] = stream
        self.in_flight[client] += 1
        self.cores[core].outstanding += 1
        placed = self.placed.get(request_id, (core, 0))
        self.placed[request_id] = (placed[0], placed[1] + 1)
        self.prefixes[core].add(req.prompt_ids)
        self.send(
            Add(stream.key, request_id, req.prompt_ids, req.max_tokens, req.sampling, arrival),
            core,
        )
        return stream

    def abort(self, stream: RequestStream, reason: str = "aborted") -> None:
        if stream.key in self.streams and self.cores[stream.core].error is None:
            self.send(Abort(stream.key, reason), stream.core)

    async def snapshot(self, since_step: int, since_request: int, engine: int = 0) -> dict:
        """Core `engine`'s timeline records from the cursors on (engine_loop.py `snapshot`);
        {} if that core has stopped."""
        if self.cores[engine].error is not None:
            return {}
        key = next(self.keys)
        future = asyncio.get_running_loop().create_future()
        self.snapshots[key] = (future, engine)
        self.send(Snapshot(key, since_step, since_request), engine)
        return await future

    def drain(self, timeout: float) -> None:
        """Stop taking requests (503); those in flight may finish for `timeout` seconds."""
        self.draining = True
        for i, c in enumerate(self.cores):
            if c.error is None:
                self.send(Drain(timeout), i)

    # ---- events, in the event loop's thread -------------------------------------------------
    def dispatch(self, events: list[Event], core: int = 0) -> None:
        for event in events:
            if isinstance(event, StepStats):
                self.metrics.observe(event, self.label(core))
                c = self.cores[core]
                c.kv_blocks_used, c.kv_blocks_total = event.kv_blocks_used, event.kv_blocks_total
            elif isinstance(event, SnapshotData):
                future, _ = self.snapshots.pop(event.key, (None, core))
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
        self.cores[stream.core].outstanding -= 1
        core, n = self.placed.pop(stream.request_id)
        if n > 1:
            self.placed[stream.request_id] = (core, n - 1)

    def fail(self, core: int, error: str) -> None:
        """Engine core `core` stopped: each of its open streams ends with an error, each of its
        snapshots with nothing; the router no longer chooses it. The other cores go on."""
        if self.cores[core].error is not None:
            return
        self.cores[core].error = error
        for stream in [s for s in self.streams.values() if s.core == core]:
            self.close(stream)
            stream.queue.put_nowait(
                Rejected(stream.key, 500, f"the engine stopped: {error}", type="internal_error")
            )
        for key, (future, c) in list(self.snapshots.items()):
            if c == core:
                del self.snapshots[key]
                if not future.done():
                    future.set_result({})
