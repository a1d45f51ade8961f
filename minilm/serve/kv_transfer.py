"""Disaggregated prefill with a real KV transfer: a prefill engine core and a decode engine
core, each a process of its own, and the API process as the proxy in front (docs/SERVING.md).

    client = DisaggEngineClient("docstrings", prefill_config, decode_config, metrics)
    await client.start()            # two engine-core processes and the KV link between them
    stream = client.add(...)        # as any EngineClient: the client sees one server

A request goes to the prefill core (`kv_role="kv_producer"`), which computes its prompt and
samples its first token; right after that step it sends a `KVBlocks` message (messages.py:
the request, the K/V of its prompt's blocks, their prefix-cache keys) down the KV link and
ends the request on its side with the finish reason "transferred" (its blocks freed; with
prefix caching their full blocks stay named for later prompts). The decode core
(`kv_role="kv_consumer"`) checks the message, streams the first token, and, once it has a
seat and the blocks, writes the K/V into its own blocks and runs the request from its second
token as if it had computed the prompt itself (`Scheduler.add` with `running`). While it has neither, the request waits with
its KV held in the decode process's memory (`ConsumerLoop.held`), nothing lost; once admitted
it is an ordinary running request: preempted, it is recomputed from its tokens.

The link is a ZeroMQ PUSH socket of the prefill core connected to tcp://kv_ip:kv_port, which
the decode core's command socket also binds: KV messages and the API's commands arrive on
one socket, each decoded the same way, so another machine could be on the other end. The link
keeps order, which is how an abort during a transfer frees both sides: the API sends it to
both cores, and the prefill core passes it down the link (`KVCancel`) after any KVBlocks it
sent for that request, so the decode core either has the request by then, and aborts it, or
never will.

Each transfer is a record on both sides' timelines (a step whose one item has kind
"transfer": the Gantt draws it) and a row of `transfers` in each core's snapshot: bytes, and
when it was sent, received and written into the decode side's blocks.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import zmq

from ..config import EngineConfig, InvalidValue
from ..core.engine import Engine
from ..core.kv_cache import cdiv
from ..core.prefix_cache import block_keys
from ..model.runner import CachedRequest
from ..plan import NewRequest
from ..request import Request
from ..timeline import StepItem, StepRecord
from ..workload import RequestSpec
from .engine_client import RequestStream
from .engine_core import ProcessEngineClient
from .engine_loop import EngineLoop
from .messages import (
    Abort,
    Accepted,
    Command,
    Event,
    KVBlocks,
    KVCancel,
    Rejected,
    StepStats,
    Tokens,
    encode,
)
from .metrics import ServerMetrics
from .openai_api import GenerateRequest

ROLES = ("kv_producer", "kv_consumer")


@dataclass(frozen=True)
class KVTransferConfig:
    """One side of the pair, in vLLM's `--kv-transfer-config` keys."""

    kv_role: str  # kv_producer (prefill) | kv_consumer (decode)
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579

    def __post_init__(self):
        if self.kv_role not in ROLES:
            raise InvalidValue("kv_role", self.kv_role, f"must be one of {', '.join(ROLES)}")
        if not isinstance(self.kv_port, int) or not 0 < self.kv_port < 65536:
            raise InvalidValue("kv_port", self.kv_port, "must be a TCP port in [1, 65535]")

    @property
    def address(self) -> str:
        return f"tcp://{self.kv_ip}:{self.kv_port}"


def link_options(text: str) -> dict:
    """`minilm serve --kv-transfer-config JSON`: the link's keys (kv_connector, kv_ip, kv_port);
    the server starts one engine core of each role itself. A bad key or value is refused by name."""
    try:
        keys = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidValue("--kv-transfer-config", text, f"not JSON ({e})") from None
    if not isinstance(keys, dict):
        raise InvalidValue("--kv-transfer-config", text, "must be a JSON object")
    known = {"kv_connector", "kv_ip", "kv_port"}
    for key in keys:
        if key not in known:
            why = "the server runs one core of each role" if key == "kv_role" else "unknown key"
            raise InvalidValue(key, keys[key], f"{why}; known: {', '.join(sorted(known))}")
    connector = keys.pop("kv_connector", "ZmqConnector")
    if connector != "ZmqConnector":
        raise InvalidValue("kv_connector", connector, "only ZmqConnector is built in")
    if "kv_port" in keys:
        KVTransferConfig("kv_producer", kv_port=keys["kv_port"])  # its check
    return keys


def make_loop(
    kv: KVTransferConfig, ctx: zmq.Context, commands: zmq.Socket, engine: Engine, *options
) -> EngineLoop:
    """The engine-core process's loop for its role (engine_core.py `run_engine_core`)."""
    if kv.kv_role == "kv_producer":
        link = ctx.socket(zmq.PUSH)
        link.connect(kv.address)
        return ProducerLoop(engine, link, *options)
    # The decode side binds: a second pair given the same port fails here, at its start. Were
    # the prefill side to bind, a second pair's decode core could connect to the first pair's
    # link, and the PUSH socket would deal its KV messages round-robin to both decode cores.
    try:
        commands.bind(kv.address)  # the link's messages arrive among the commands
    except zmq.ZMQError as e:
        why = f"{kv.address} cannot be bound ({e}): another pair's link? leave kv_port out"
        raise InvalidValue("kv_port", kv.kv_port, why) from None
    return ConsumerLoop(engine, *options)


# ---- the message: a prompt's KV as bytes and back ------------------------------------------
def kv_message(engine: Engine, req: Request, key: int) -> KVBlocks:
    """The KVBlocks of a request that has just sampled its first token on this engine."""
    bs = engine.kv_manager.block_size
    table = engine.kv_manager.block_tables[req.request_id][: cdiv(req.prompt_len, bs)]
    kv = engine.executor.kv_cache[:, :, table]  # indexing with a list copies the blocks
    sampling = asdict(req.params)
    del sampling["max_tokens"]
    return KVBlocks(
        key,
        req.request_id,
        req.prompt_ids,
        req.output_ids[0],
        req.output_logprobs[0] if req.output_logprobs else None,
        req.params.max_tokens,
        sampling,
        req.arrival + engine.clock.origin,
        [hash(k) for k in block_keys(req, bs, req.prompt_len // bs)],
        str(kv.dtype).removeprefix("torch."),
        list(kv.shape),
        kv.contiguous().view(torch.uint8).numpy().tobytes(),
        time.perf_counter(),
    )


def received_kv(msg: KVBlocks, req: Request, cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """The message's K/V as a tensor shaped for `cache` (the decode engine's), after checking
    that it is one: InvalidValue naming the first field that is not."""
    rid = msg.request_id
    shape = [*cache.shape[:2], cdiv(req.prompt_len, block_size), *cache.shape[3:]]
    dtype = str(cache.dtype).removeprefix("torch.")
    if msg.dtype != dtype:
        raise InvalidValue("dtype", msg.dtype, f"the decode engine's KV cache is {dtype}", rid)
    if msg.shape != shape:
        raise InvalidValue("shape", msg.shape, f"expected {shape} for this prompt and cache", rid)
    size = math.prod(shape) * cache.element_size()
    if len(msg.kv) != size:
        raise InvalidValue("kv", f"{len(msg.kv)} bytes", f"shape {shape} needs {size}", rid)
    mine = [hash(k) for k in block_keys(req, block_size, req.prompt_len // block_size)]
    if msg.block_hashes != mine:
        raise InvalidValue(
            "block_hashes", msg.block_hashes, f"the prompt's blocks hash to {mine} here", rid
        )
    return torch.frombuffer(bytearray(msg.kv), dtype=cache.dtype).view(shape)


def record_transfer(engine: Engine, rid: str, t_start: float, t_end: float, length: int) -> None:
    """A transfer as a step of the engine's timeline: one item of kind "transfer" (no tokens
    computed; `length`, the prompt's, as its context), drawn by the Gantt."""
    kv = engine.kv_manager
    engine.timeline.steps.append(
        StepRecord(
            engine.num_steps,
            t_start,
            t_end,
            [StepItem(rid, "transfer", 0, length)],
            engine.num_running,
            engine.num_waiting,
            kv.num_used_blocks,
            kv.num_blocks,
            0,
        )
    )
    engine.num_steps += 1


class KVStatus:
    """What both loops add to a snapshot: the KV manager's free blocks and the transfers (the
    last `--timeline-window` of them: a server's memory stays flat)."""

    engine: Engine
    transfers: deque[dict]

    def snapshot(self, since_step: int, since_request: int) -> dict:
        data = super().snapshot(since_step, since_request)
        data["kv_free_blocks"] = self.engine.kv_manager.num_free_blocks
        data["transfers"] = list(self.transfers)
        data["held"] = len(getattr(self, "held", ()))
        return data


# ---- the prefill side ------------------------------------------------------------------------
class ProducerLoop(KVStatus, EngineLoop):
    def __init__(self, engine: Engine, link: zmq.Socket, *options):
        super().__init__(engine, *options)
        self.link, self.transfers = link, deque(maxlen=self.history.window)

    def step(self) -> list[Event]:
        """A step, then the KV of every request it gave its first token goes down the link."""
        events = super().step()
        for key, rid in list(self.request_ids.items()):
            req = self.engine.requests[rid]
            if req.output_ids:  # its first token (one that ended the request is not here)
                events += self.send(key, req)
        return events

    def send(self, key: int, req: Request) -> list[Event]:
        engine, t0 = self.engine, time.perf_counter()
        msg = kv_message(engine, req, key)
        self.link.send(encode([msg]), copy=False)
        t1 = time.perf_counter()
        origin = engine.clock.origin
        record_transfer(engine, req.request_id, t0 - origin, t1 - origin, req.prompt_len)
        self.transfers.append(
            {"request_id": req.request_id, "bytes": len(msg.kv), "send_s": t1 - t0}
        )
        return EngineLoop.abort(self, key, "transferred")  # its blocks freed now

    def abort(self, key: int, reason: str = "aborted") -> list[Event]:
        """Here, and down the link: after any KVBlocks this request sent (see the docstring)."""
        events = super().abort(key, reason)
        self.link.send(encode([KVCancel(key, reason)]))
        return events


# ---- the decode side -------------------------------------------------------------------------
@dataclass
class Held:
    """A received request waiting for a seat and blocks, its KV in this process's memory."""

    key: int
    msg: KVBlocks
    req: Request
    kv: torch.Tensor
    t_received: float  # perf_counter
    row: dict  # its row of `transfers`


class ConsumerLoop(KVStatus, EngineLoop):
    def __init__(self, engine: Engine, *options):
        super().__init__(engine, *options)
        self.held: deque[Held] = deque()
        self.transfers = deque(maxlen=self.history.window)

    def apply(self, command: Command) -> list[Event]:
        if isinstance(command, KVBlocks):
            return self.receive(command)
        if isinstance(command, KVCancel | Abort):
            return self.abort(command.key, command.reason)
        return super().apply(command)

    def receive(self, msg: KVBlocks) -> list[Event]:
        """Check a request and its KV (a bad one is refused, nothing kept), hold it, stream its
        first token, and admit what fits."""
        t = time.perf_counter()
        engine = self.engine
        try:
            spec = RequestSpec(
                msg.request_id, msg.prompt_ids, msg.max_tokens, self.arrival(msg.arrival)
            )
            req = engine.make_request(spec, **msg.sampling)
            engine.check_request(req)
            if any(h.req.request_id == req.request_id for h in self.held):
                raise InvalidValue("request_id", req.request_id, "already in use", req.request_id)
            kv = received_kv(msg, req, engine.executor.kv_cache, engine.kv_manager.block_size)
        except InvalidValue as e:
            return [Rejected(msg.key, 400, str(e), e.name, e.code)]
        req.append_output(msg.first_token)
        if msg.first_logprobs is not None:
            req.output_logprobs.append(msg.first_logprobs)
        origin = engine.clock.origin
        record_transfer(engine, req.request_id, msg.sent_at - origin, t - origin, req.prompt_len)
        row = {"request_id": req.request_id, "bytes": len(msg.kv), "link_s": t - msg.sent_at}
        self.transfers.append(row)
        self.held.append(Held(msg.key, msg, req, kv, t, row))
        self.admit_held()
        logprobs = None if msg.first_logprobs is None else [msg.first_logprobs]
        return [Tokens(msg.key, [msg.first_token], logprobs)]

    def step(self) -> list[Event]:
        events = super().step()
        self.admit_held()  # into the next step
        return events

    def admit_held(self) -> None:
        """Held requests into the batch, first come first: while one has a seat and its blocks,
        and no request this engine preempted waits (that one goes first)."""
        while self.held and self.engine.num_waiting == 0 and self.place(self.held[0]):
            self.held.popleft()

    def place(self, h: Held) -> bool:
        """Write a held request's KV into blocks of its own (sharing any prefix this engine has
        cached) and run it; False, nothing changed, when there is no seat or too few blocks."""
        engine, kv, req = self.engine, self.engine.kv_manager, h.req
        if engine.num_running >= engine.config.max_num_seqs:
            return False
        cached = kv.get_computed_blocks(req)  # full prompt blocks this engine already holds
        n = len(cached)
        table = kv.allocate_slots(req, req.prompt_len - n * kv.block_size, computed=cached)
        if table is None:
            return False
        engine.executor.kv_cache[:, :, table[n:]] = h.kv[:, :, n:]
        now = engine.clock.now
        req.num_computed_tokens, req.num_cached_tokens = req.prompt_len, n * kv.block_size
        req.t_scheduled = now
        req.t_first_token = h.t_received - engine.clock.origin  # when it was streamed
        req.token_times = [req.t_first_token]
        new = NewRequest(req.prompt_ids, req.params, req.eos_token_id)
        tokens = [*req.prompt_ids, *req.output_ids]  # the runner's copy: prompt and first token
        engine.executor.requests[req.request_id] = CachedRequest(new, tokens, None)
        engine.requests[req.request_id] = req
        engine.scheduler.add(req, running=True)  # its prompt computed: it decodes from here
        self.request_ids[h.key], self.keys[req.request_id], self.sent[h.key] = (
            req.request_id,
            h.key,
            1,
        )
        h.row["held_s"] = now + engine.clock.origin - h.t_received  # a seat, blocks, the write
        h.row["cached_blocks"] = n
        return True

    def abort(self, key: int, reason: str = "aborted") -> list[Event]:
        for h in self.held:
            if h.key == key:
                self.held.remove(h)
                return [Tokens(key, [], finish_reason=reason)]
        return super().abort(key, reason)


def free_tcp_port(host: str) -> int:
    """A port no one listens on now, for the KV link (the decode core binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---- the proxy: the API process --------------------------------------------------------------
PREFILL, DECODE = 0, 1  # the pair's engine cores, in ProcessEngineClient's list


class DisaggEngineClient(ProcessEngineClient):
    """vLLM's disaggregated-serving proxy, inside the API process: two engine cores (core 0
    prefills, core 1 decodes), each request to the prefill core, its tokens from the decode
    core; one URL for the client. `prefill`, `decode`: each core's knobs; `options`:
    ProcessEngineClient's (max_waiting, stream_interval, timeline_path, window)."""

    def __init__(
        self,
        model: str,
        prefill: EngineConfig,
        decode: EngineConfig,
        metrics: ServerMetrics,
        kv_ip: str = "127.0.0.1",
        kv_port: int | None = None,
        **options,
    ):
        super().__init__(model, decode, metrics, data_parallel_size=2, **options)
        # keys sent to the prefill core whose Accepted (or refusal) has not come back yet, each
        # with the decode core's events for it that came first (see `dispatch`)
        self.early: dict[int, list[Event]] = {}
        port = kv_port or free_tcp_port(kv_ip)
        self.sides = (
            (prefill, "prefill", KVTransferConfig("kv_producer", kv_ip, port)),
            (decode, "decode", KVTransferConfig("kv_consumer", kv_ip, port)),
        )

    def core_options(self, core: int) -> tuple[EngineConfig, str | None, KVTransferConfig]:
        """Each side its knobs, its half of the link and its file: NAME.prefill.json, ..."""
        config, side, link = self.sides[core]
        path = self.args[4]
        return config, None if path is None else str(Path(path).with_suffix(f".{side}.json")), link

    @property
    def data_parallel_size(self) -> int:
        return 1  # one pipeline: /timeline answers for the pair (the decode side's cursors)

    @property
    def error(self) -> str | None:
        """The pair serves only whole: why one side stopped, if one did."""
        errors = [
            f"the {self.sides[i][1]} engine core: {c.error}"
            for i, c in enumerate(self.cores)
            if c.error
        ]
        return "; ".join(errors) or None

    def place(self, request_ids, prompt_ids) -> int:
        return PREFILL

    def add(
        self, request_id: str, req: GenerateRequest, arrival: float, client: str = "", core: int = 0
    ) -> RequestStream:
        stream = super().add(request_id, req, arrival, client, core)
        if stream.key in self.streams:  # sent to the prefill core (not refused here at once)
            self.early[stream.key] = []
        return stream

    def abort(self, stream, reason: str = "aborted") -> None:
        """To both sides: the prefill core also passes it down the link after any KV it sent."""
        if stream.key in self.streams and self.error is None:
            for core in (PREFILL, DECODE):
                self.send(Abort(stream.key, reason), core)

    async def snapshot(self, since_step: int, since_request: int, engine: int = 0) -> dict:
        """GET /timeline: the decode core's records, and the prefill core's under "prefill" (from
        the same cursors: the live page follows the decode core's)."""
        decode, prefill = await asyncio.gather(
            super().snapshot(since_step, since_request, DECODE),
            super().snapshot(since_step, since_request, PREFILL),
        )
        return {**decode, "prefill": prefill} if decode and prefill else {}

    def dispatch(self, events: list[Event], core: int = 0) -> None:
        """The decode core's events all go on; of the prefill core's, a request's refusal or its
        end there (a first token that stopped it, an abort before the transfer) and snapshots:
        its first token comes from the decode core, once the KV has arrived, so the client's
        time to first token includes the transfer. The metrics are the decode core's.

        The two cores' events come on two sockets, read by two tasks, so nothing orders one
        request's Accepted (prefill) before its first token (decode): a task reads what its
        socket holds without yielding, so when this process falls behind (a loaded machine)
        the decode core's tokens can come first. A request's decode events wait in `early`
        until its Accepted has gone on: every stream still begins with Accepted or Rejected."""
        if core == PREFILL:
            out = []
            for e in events:
                if isinstance(e, Accepted | Rejected) and e.key in self.early:
                    out += [e, *self.early.pop(e.key)]
                elif not isinstance(e, StepStats) and not (
                    isinstance(e, Tokens) and e.finish_reason in (None, "transferred")
                ):
                    out.append(e)
            events = out
        else:  # (a snapshot's key is never a stream's: one counter gives both)
            for e in events:
                if getattr(e, "key", None) in self.early:
                    self.early[e.key].append(e)
            events = [e for e in events if getattr(e, "key", None) not in self.early]
        super().dispatch(events, core)

    def label(self, core: int) -> str:
        return "0"  # one engine to /metrics: the decode core's steps

    def fail(self, core: int, error: str) -> None:
        """One side stopped: the pair cannot serve, so every stream ends with its error."""
        self.early.clear()
        for c in (PREFILL, DECODE):
            super().fail(c, error if c == core else f"its {self.sides[core][1]} side stopped")
