"""The process design: the engine core in a process of its own, as in vLLM V1 (lesson 9).

    client = ProcessEngineClient("docstrings", config, metrics)   # the HTTP side's handle
    await client.start()                                          # spawns the engine-core process
    ProcessEngineClient(..., data_parallel_size=2, router="least_outstanding")   # two of them

The HTTP server (its event loop, SSE, tokenizing and detokenizing) runs in one process,
the engine in another, so the two no longer take turns on one interpreter lock: on a
2-core laptop each gets a core. They talk over ZeroMQ sockets in msgpack (messages.py):
commands one way, each step's events the other. The engine-core process is a busy loop
(`run_engine_core`): it takes whatever commands have come, applies them between steps
(engine_loop.py), runs a step when there is work and otherwise waits on its socket.

With `data_parallel_size` N there are N engine-core processes, each its own engine (model
copy, scheduler, KV cache) with its own pair of sockets; nothing passes between them. The
HTTP side routes each request to one of them (engine_client.py `place`) and reads each one's
events in a task of its own. Core i's `--timeline FILE` is FILE with `.engine<i>` before the
suffix (N > 1).

If an engine-core process dies, the HTTP side sees its exit at once (the process's
sentinel): every stream still open on it ends with an error event and the router stops
sending it requests; once no core is left, new requests get 503.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from ..config import EngineConfig
from ..router import RouterPolicy
from .engine_client import EngineClient, EngineInfo
from .history import DEFAULT_WINDOW
from .messages import Command, EngineError, Ready, Stop, decode_commands, decode_events, encode
from .metrics import ServerMetrics

if TYPE_CHECKING:
    from .kv_transfer import KVTransferConfig


def run_engine_core(
    model: str,
    config: EngineConfig,
    commands_addr: str,
    events_addr: str,
    max_waiting: int | None,
    stream_interval: int,
    timeline_path: str | None,
    window: int | None,
    origin: float,
    kv_transfer: KVTransferConfig | None = None,
) -> None:
    """The engine-core process's main: build the engine, then serve commands until Stop.
    `origin`: the perf_counter() time its clock counts from (one for every core: one time axis);
    `kv_transfer`: one side of a disaggregated pair (kv_transfer.py)."""
    # a terminal's Ctrl-C reaches every process of its group: the HTTP side drains this one
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ..core.clock import WallClock
    from ..core.engine import Engine
    from .engine_loop import EngineLoop

    ctx = zmq.Context()
    commands, events = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    commands.connect(commands_addr)
    events.connect(events_addr)
    try:
        clock = WallClock(config.device)
        clock.origin = origin
        engine = Engine(model, config, clock=clock)
        options = (max_waiting, stream_interval, window, timeline_path)
        if kv_transfer is None:
            loop = EngineLoop(engine, *options)
        else:
            from .kv_transfer import make_loop

            loop = make_loop(kv_transfer, ctx, commands, engine, *options)
        events.send(encode([Ready(engine.timeline.meta, engine.config.max_model_len)]))
        stopping = False
        while not stopping:
            out = []  # the commands' answers go out before the step, which may fail
            for command in receive(
                commands, block=not engine.has_unfinished(), until=loop.draining_until
            ):
                stopping = stopping or isinstance(command, Stop)
                out += [] if isinstance(command, Stop) else loop.apply(command)
            if out:
                events.send(encode(out))
                loop.retire()
            out = (
                loop.abort_all()
                if stopping or loop.drain_due()
                else loop.step()
                if engine.has_unfinished()
                else []
            )
            if out:
                events.send(encode(out))
                loop.retire()
        loop.history.close()
    except BaseException as e:  # noqa: BLE001 (tell the HTTP side why, then exit)
        events.send(encode([EngineError(f"{e!r}\n{traceback.format_exc(limit=5)}")]))
        raise
    finally:
        events.close(linger=2000)
        commands.close(linger=0)
        ctx.destroy(linger=2000)  # and the KV link's socket, if there is one


def receive(sock: zmq.Socket, block: bool, until: float | None) -> list[Command]:
    """Every command waiting on the socket; with `block`, first wait for one (until the drain
    deadline, if there is one: then the loop must wake to abort what is left)."""
    timeout = None if until is None else max(0, int((until - time.monotonic()) * 1000))
    commands: list[Command] = []
    if block and not sock.poll(timeout):
        return commands
    while sock.poll(0):
        commands += decode_commands(sock.recv())
    return commands


def core_timeline_path(path: str | None, core: int, data_parallel_size: int) -> str | None:
    """Core `core`'s `--timeline FILE`: FILE itself for one core, else run.engine1.json for run.json."""
    if path is None or data_parallel_size == 1:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.engine{core}{p.suffix}"))


@dataclass
class CoreProcess:
    """One engine-core process and this side's two sockets to it."""

    addrs: tuple[str, str]  # commands, events
    commands: zmq.Socket
    events: zmq.asyncio.Socket
    process: multiprocessing.Process | None = None
    receiver: asyncio.Task | None = None


class ProcessEngineClient(EngineClient):
    def __init__(
        self,
        model: str,
        config: EngineConfig,
        metrics: ServerMetrics,
        max_waiting: int | None = 1024,
        stream_interval: int = 1,
        timeline_path: str | None = None,
        window: int | None = DEFAULT_WINDOW,
        data_parallel_size: int = 1,
        router: str | RouterPolicy = "least_outstanding",
    ):
        super().__init__(metrics, data_parallel_size, router)
        self.args = (model, config, max_waiting, stream_interval, timeline_path, window)
        # commands go out from the event loop's thread and must never block it (see `send`): a
        # plain socket; events come in with an await: an asyncio socket
        self.sync_ctx, self.ctx = zmq.Context(), zmq.asyncio.Context()
        self.folder = tempfile.mkdtemp(prefix="minilm-engine-")
        self.procs = [self.sockets(i) for i in range(data_parallel_size)]

    def sockets(self, core: int) -> CoreProcess:
        addrs = (f"ipc://{self.folder}/commands{core}", f"ipc://{self.folder}/events{core}")
        commands, events = self.sync_ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        commands.setsockopt(zmq.SNDHWM, 0)  # queue every command, however many: none refused
        commands.bind(addrs[0])
        events.bind(addrs[1])
        return CoreProcess(addrs, commands, events)

    @property
    def pid(self) -> int | None:
        """The first engine core's process id."""
        return self.pids[0]

    @property
    def pids(self) -> list[int | None]:
        return [p.process.pid if p.process is not None else None for p in self.procs]

    async def start(self, timeout: float = 300.0) -> None:
        model, _, max_waiting, stream_interval, _, window = self.args
        loop = asyncio.get_running_loop()
        origin = time.perf_counter()  # the same on every process of the machine (Linux)
        for i, proc in enumerate(self.procs):
            config, timeline_path, kv_transfer = self.core_options(i)
            proc.process = multiprocessing.get_context("spawn").Process(
                target=run_engine_core,
                name=f"minilm-engine-core-{i}",
                daemon=True,
                args=(
                    model,
                    config,
                    *proc.addrs,
                    max_waiting,
                    stream_interval,
                    timeline_path,
                    window,
                    origin,
                    kv_transfer,
                ),
            )
            proc.process.start()
            # readable once the process has ended
            loop.add_reader(proc.process.sentinel, self.exited, i)
        firsts = await asyncio.gather(
            *(asyncio.wait_for(p.events.recv(), timeout) for p in self.procs)
        )
        errors = [
            e.message for e in (decode_events(f)[0] for f in firsts) if isinstance(e, EngineError)
        ]
        if errors:
            await self.stop()  # the cores that did start: none may linger on a socket
            raise RuntimeError(f"the engine-core process failed to start: {errors[0]}")
        ready = decode_events(firsts[0])[0]
        self.ready(EngineInfo(ready.meta, ready.max_model_len))
        for i, proc in enumerate(self.procs):
            proc.receiver = asyncio.create_task(self.receive(i))

    async def receive(self, core: int) -> None:
        while True:
            events = decode_events(await self.procs[core].events.recv())
            errors = [e.message for e in events if isinstance(e, EngineError)]
            self.dispatch([e for e in events if not isinstance(e, EngineError)], core)
            if errors:
                self.fail(core, errors[0].splitlines()[0])

    def exited(self, core: int) -> None:
        process = self.procs[core].process
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join(1)  # its pipes close just before it can be reaped: wait for its exit code
        # after a Stop too: nothing may be sent to it any more
        name = "the engine-core process" + (f" {core}" if len(self.procs) > 1 else "")
        self.fail(core, f"{name} (pid {process.pid}) exited with code {process.exitcode}")

    def core_options(self, core: int) -> tuple[EngineConfig, str | None, KVTransferConfig | None]:
        """Core `core`'s knobs, timeline file and side of a KV link: alike here but for the file;
        kv_transfer.py's pair gives each side its own."""
        return self.args[1], core_timeline_path(self.args[4], core, len(self.procs)), None

    def send(self, command: Command, core: int = 0) -> None:
        """Never waits: a PUSH socket whose peer has closed its end (a core that is exiting, alive
        until it is reaped) would block the event loop for good. Such a core's command is
        dropped: `exited` ends its streams with an error once the process is gone. (A starting
        core connects before it builds its engine, so its end is there before its Ready.)"""
        try:
            self.procs[core].commands.send(encode([command]), zmq.NOBLOCK)
        except zmq.Again:
            pass

    async def stop(self) -> None:
        """Stop every core at once (each drains its own requests), then wait for all of them."""
        running = [p.process for p in self.procs if p.process is not None and p.process.is_alive()]
        for i, p in enumerate(self.procs):
            if p.process in running:
                self.send(Stop(), i)
        for process in running:
            await asyncio.to_thread(process.join, 30)
            if process.is_alive():
                process.kill()
        for p in self.procs:
            if p.receiver is not None:
                p.receiver.cancel()
            p.commands.close(linger=0)
            p.events.close(linger=0)
            for addr in p.addrs:
                path = addr.removeprefix("ipc://")
                if os.path.exists(path):
                    os.unlink(path)
        self.sync_ctx.term()
        self.ctx.term()
        os.rmdir(self.folder)
