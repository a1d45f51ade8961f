"""The in-process design: the engine in a thread of the HTTP server's own process (lesson 9).

    client = ThreadEngineClient(engine, metrics, max_waiting=1024, stream_interval=1)

Commands go to the engine thread through a list under a condition variable; the thread
applies them between steps (engine_loop.py), and with nothing to do it sleeps on the
condition (no busy waiting). Its events go to the event loop's thread in one
`call_soon_threadsafe` per step (asyncio objects are not thread-safe).

The two threads share one interpreter lock (the GIL): only one runs Python at a time,
and a small model's step is mostly Python, so the HTTP side's work adds to the engine's
instead of running beside it. That is why vLLM V1 moved its engine core into a process
of its own, and why this server does the same by default (engine_core.py); this design
stays so that lesson 9 can measure the difference. It is also what the tests use to
look inside the engine after a run.
"""

from __future__ import annotations

import asyncio
import threading
import time

from ..core.engine import Engine
from .engine_client import EngineClient, EngineInfo
from .engine_loop import EngineLoop
from .history import DEFAULT_WINDOW
from .messages import Command, Stop
from .metrics import ServerMetrics


class ThreadEngineClient(EngineClient):
    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics,
        max_waiting: int | None = 1024,
        stream_interval: int = 1,
        timeline_path: str | None = None,
        window: int | None = DEFAULT_WINDOW,
    ):
        super().__init__(metrics)
        self.engine = engine
        self.loop = EngineLoop(engine, max_waiting, stream_interval, window, timeline_path)
        self.cond = threading.Condition()
        self.commands: list[Command] = []
        self.thread = threading.Thread(target=self.run, name="minilm-engine", daemon=True)
        self.event_loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self.event_loop = asyncio.get_running_loop()
        self.ready(EngineInfo(self.engine.timeline.meta, self.engine.config.max_model_len))
        self.thread.start()

    async def stop(self) -> None:
        self.send(Stop())
        await asyncio.to_thread(self.thread.join, 30)
        self.loop.history.close()

    def send(self, command: Command, core: int = 0) -> None:  # one core: the thread's
        with self.cond:
            self.commands.append(command)
            self.cond.notify()

    # ---- the engine thread ----------------------------------------------------------------
    def run(self) -> None:
        engine, loop = self.engine, self.loop
        try:
            while True:
                with self.cond:
                    while not (self.commands or engine.has_unfinished() or loop.drain_due()):
                        self.cond.wait(self.wait_timeout())
                    commands, self.commands = self.commands, []
                stopping = any(isinstance(c, Stop) for c in commands)
                self.deliver(
                    [e for c in commands if not isinstance(c, Stop) for e in loop.apply(c)]
                )
                if stopping or loop.drain_due():
                    self.deliver(loop.abort_all())
                elif engine.has_unfinished():
                    self.deliver(loop.step())
                if stopping:
                    return
        except BaseException as e:  # the engine broke: every waiting handler must hear of it
            self.event_loop.call_soon_threadsafe(self.fail, 0, repr(e))
            raise

    def wait_timeout(self) -> float | None:
        """Sleep until a command comes, or until the grace period of a shutdown ends."""
        until = self.loop.draining_until
        return None if until is None else max(0.0, until - time.monotonic())

    def deliver(self, events: list) -> None:
        if events:
            self.event_loop.call_soon_threadsafe(self.dispatch, events)
            self.loop.retire()
