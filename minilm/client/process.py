"""`python -m minilm serve` in a child process, from a notebook or a script (lesson 9, the lecture demo).

    server = ServerProcess(policy="static", timeline="static.json")   # waits until /health answers
    server.url                     # http://127.0.0.1:PORT (a free port unless one is given)
    ServerProcess(api_key="k", max_inflight_per_client=2)   # a room's server: a key, a limit per client
    server.headers                 # what a client sends: {"Authorization": "Bearer k"} with a key
    server.stop()                  # Ctrl-C by its pid: it drains, stops, writes the timeline

The server gets a process of its own (not a thread of the notebook's kernel), as it
would in production: the kernel stays free to draw. (The server then starts its engine
core in a process of its own too, unless given engine_core="thread".)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import bearer

ROOT = (
    Path(__file__).resolve().parents[2]
)  # the repository: `python -m minilm` must import from here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lan_address() -> str:
    """This machine's address on its network (what a lecture audience types); no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class ServerProcess:
    def __init__(
        self,
        model: str = "docstrings",
        policy: str = "continuous",
        port: int | None = None,
        host: str = "127.0.0.1",
        timeline: str | Path | None = None,
        timeout: float | None = 120.0,
        api_key: str | None = None,
        **knobs,
    ):
        """`knobs`: any `serve` flag, by its Python name (max_num_seqs=8 -> --max-num-seqs 8).
        `api_key`: the key clients must send (`serve --api-key`, handed over as MINILM_API_KEY: a
        command line is visible to the machine's other users); None: no key, even if this
        process has MINILM_API_KEY set. Waits until the server answers, at most `timeout`
        seconds (None: call `wait_ready` later, e.g. to start several servers at once)."""
        self.port = port or free_port()
        self.host, self.api_key = host, api_key
        self.headers = bearer(api_key)
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            sys.executable,
            "-m",
            "minilm",
            "serve",
            "--model",
            model,
            "--policy",
            policy,
            "--host",
            host,
            "--port",
            str(self.port),
        ]
        if timeline is not None:
            args += ["--timeline", str(timeline)]
        for name, value in knobs.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        env.pop("MINILM_API_KEY", None)
        if api_key is not None:
            env["MINILM_API_KEY"] = api_key
        # its output goes to a file, not a pipe: a pipe nobody reads fills up and stalls the server
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix="minilm-serve-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        if timeout is not None:
            self.wait_ready(timeout)

    @property
    def public_url(self) -> str:
        """The address other machines use (when started with host="0.0.0.0")."""
        return f"http://{lan_address() if self.host == '0.0.0.0' else self.host}:{self.port}/"

    def wait_ready(self, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {self.proc.returncode}:\n{self.output()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"the server did not answer /health within {timeout} s")
            time.sleep(0.1)

    def output(self) -> str:
        """What the server printed so far."""
        return Path(self.log.name).read_text()

    def stop(self, timeout: float = 60.0) -> int:
        """Ctrl-C (SIGINT) to its pid, then wait: in-flight requests drain, --timeline is written."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
