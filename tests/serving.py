"""A real server on a free port, in this process (tests/test_server.py, tests/test_bench_serve.py).

uvicorn runs in a thread with its own event loop; the engine runs in the server's engine
thread; the test talks to it over real HTTP. Being in-process lets a test look at the
engine afterwards (its KV blocks, its timeline) once the server is idle.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import uvicorn

from minilm import Engine, EngineConfig
from minilm.core.clock import WallClock
from minilm.serve.process import free_port
from minilm.serve.server import create_app


def docstrings_engine(**knobs) -> Engine:
    return Engine("docstrings", EngineConfig(**{"max_num_seqs": 16, **knobs}), clock=WallClock())


@contextmanager
def serving(engine: Engine | None = None, **app_knobs):
    """Yields (base_url, engine, app); the server stops (engine thread included) on exit."""
    engine = engine or docstrings_engine()
    app = create_app(engine, "docstrings", **app_knobs)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", engine, app
    finally:
        server.should_exit = True
        thread.join(30)


def wait_idle(engine: Engine, timeout: float = 30) -> None:
    """Until the engine has nothing unfinished (read from the test thread: only safe when idle)."""
    deadline = time.monotonic() + timeout
    while engine.has_unfinished() or any(not r.finished for r in list(engine.requests.values())):
        if time.monotonic() > deadline:
            raise TimeoutError("the engine did not become idle")
        time.sleep(0.01)
