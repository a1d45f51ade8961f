"""The process design: the engine core in a process of its own, as in vLLM V1 (lesson 9).

    client = ProcessEngineClient("docstrings", config, metrics)   # the HTTP side's handle
    await client.start()                                          # spawns the engine-core process

The HTTP server (its event loop, SSE, tokenizing and detokenizing) runs in one process,
the engine in another, so the two no longer take turns on one interpreter lock: on a
2-core laptop each gets a core. They talk over ZeroMQ sockets in msgpack (messages.py):
commands one way, each step's events the other. The engine-core process is a busy loop
(`run_engine_core`): it takes whatever commands have come, applies them between steps
(engine_loop.py), runs a step when there is work and otherwise waits on its socket.

If the engine-core process dies, the HTTP side sees its exit at once (the process's
sentinel): every stream still open ends with an error event, and new requests get 503.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import tempfile
import time
import traceback
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from ..config import EngineConfig
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
    kv_transfer: KVTransferConfig | None = None,
) -> None:
    """The engine-core process's main: build the engine, then serve commands until Stop.
    `kv_transfer`: one side of a disaggregated pair (kv_transfer.py)."""
    from ..core.clock import WallClock
    from ..core.engine import Engine
    from .engine_loop import EngineLoop

    ctx = zmq.Context()
    commands, events = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    commands.connect(commands_addr)
    events.connect(events_addr)
    try:
        engine = Engine(model, config, clock=WallClock(config.device))
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
        kv_transfer: KVTransferConfig | None = None,
    ):
        super().__init__(metrics)
        self.args = (
            model,
            config,
            max_waiting,
            stream_interval,
            timeline_path,
            window,
            kv_transfer,
        )
        # commands go out from the event loop's thread and never block (PUSH queues them): a plain
        # socket; events come in with an await: an asyncio socket
        self.sync_ctx, self.ctx = zmq.Context(), zmq.asyncio.Context()
        folder = tempfile.mkdtemp(prefix="minilm-engine-")
        self.addrs = (f"ipc://{folder}/commands", f"ipc://{folder}/events")
        self.commands, self.events = self.sync_ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        self.commands.bind(self.addrs[0])
        self.events.bind(self.addrs[1])
        self.process: multiprocessing.Process | None = None
        self.receiver: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def start(self, timeout: float = 300.0) -> None:
        model, config, *options = self.args
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_core,
            name="minilm-engine-core",
            daemon=True,
            args=(model, config, *self.addrs, *options),
        )
        self.process.start()
        loop = asyncio.get_running_loop()
        loop.add_reader(self.process.sentinel, self.exited)  # readable once the process has ended
        first = decode_events(await asyncio.wait_for(self.events.recv(), timeout))[0]
        if isinstance(first, EngineError):
            raise RuntimeError(f"the engine-core process failed to start: {first.message}")
        self.info = EngineInfo(first.meta, first.max_model_len)
        self.receiver = asyncio.create_task(self.receive())

    async def receive(self) -> None:
        while True:
            events = decode_events(await self.events.recv())
            errors = [e.message for e in events if isinstance(e, EngineError)]
            self.dispatch([e for e in events if not isinstance(e, EngineError)])
            if errors:
                self.fail_all(errors[0].splitlines()[0])

    def exited(self) -> None:
        asyncio.get_running_loop().remove_reader(self.process.sentinel)
        if self.error is None:  # after a Stop too: nothing may be sent to it any more
            self.fail_all(f"the engine-core process exited with code {self.process.exitcode}")

    def send(self, command: Command) -> None:
        self.commands.send(encode([command]))

    async def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.send(Stop())
            await asyncio.to_thread(self.process.join, 30)
            if self.process.is_alive():
                self.process.kill()
        if self.receiver is not None:
            self.receiver.cancel()
        self.commands.close(linger=0)
        self.events.close(linger=0)
        self.sync_ctx.term()
        self.ctx.term()
        paths = [addr.removeprefix("ipc://") for addr in self.addrs]
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(os.path.dirname(paths[0]))
