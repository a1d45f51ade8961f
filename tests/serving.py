"""A real server on a free port (tests/test_server.py, tests/test_bench_serve.py).

uvicorn runs in a thread of the test's process with its own event loop; the test talks to
it over real HTTP. `serving` keeps the engine in a thread of this process (the in-process
design), so a test can look at the engine afterwards (its KV blocks, its timeline) once the
server is idle; `serving_process` puts it in a process of its own (the default design).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from minilm import Engine, EngineConfig
from minilm.client.process import free_port
from minilm.core.clock import WallClock
from minilm.model.loader import resolve_model_path
from minilm.model.tokenizer import load_tokenizer
from minilm.serve.engine_core import ProcessEngineClient
from minilm.serve.engine_thread import ThreadEngineClient
from minilm.serve.metrics import ServerMetrics
from minilm.serve.server import create_app


def docstrings_engine(**knobs) -> Engine:
    return Engine("docstrings", EngineConfig(**{"max_num_seqs": 16, **knobs}), clock=WallClock())


@contextmanager
def serving(
    engine: Engine | None = None,
    api_key: str | None = None,
    max_inflight_per_client: int | None = None,
    **client_knobs,
):
    """Yields (base_url, engine, client), the engine in a thread; the server stops (engine thread included) on
    exit. `api_key`, `max_inflight_per_client`: the room's knobs (create_app); `client_knobs`: the engine loop's."""
    engine = engine or docstrings_engine()
    client = ThreadEngineClient(
        engine, ServerMetrics("docstrings", engine.config.speculative_config), **client_knobs
    )
    app = create_app(client, "docstrings", engine.tokenizer, api_key, max_inflight_per_client)
    with running(app) as url:
        yield url, engine, client


@contextmanager
def serving_process(data_parallel_size: int = 1, router: str = "least_outstanding", **knobs):
    """Yields (base_url, client), the engine in a process of its own (`data_parallel_size` engine
    cores, each in its own, behind `router`); `knobs`: EngineConfig's."""
    config = EngineConfig(**{"max_num_seqs": 16, "enable_prefix_caching": True, **knobs})
    client = ProcessEngineClient(
        "docstrings",
        config,
        ServerMetrics("docstrings", config.speculative_config, data_parallel_size),
        data_parallel_size=data_parallel_size,
        router=router,
    )
    with running(
        create_app(client, "docstrings", load_tokenizer(resolve_model_path("docstrings")))
    ) as url:
        yield url, client
    assert not os.path.exists(client.folder), (
        "the server stopped without removing its sockets' folder"
    )


@contextmanager
def running(app):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # the process design starts a process that imports torch
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
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


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 180) -> None:
    """Until the server child `proc` answers /health (a loaded 2-core machine starts it slowly);
    a test failure with its output if it exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.ConnectError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()  # first: reading a live server's output would wait forever
            pytest.fail(f"the server did not answer /health: {proc.communicate()[0]}")
        time.sleep(0.1)
