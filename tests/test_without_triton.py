"""The lab without Triton, as on a Mac (Triton publishes wheels for Linux only), proven here on
Linux: a child process in which `import triton` fails imports minilm and widgets, runs the
engine and the simulator, serves a request over HTTP, refuses the Triton backend with a
clear error, and runs lesson 5's code, whose kernel cells say in one line that they skip."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NO_TRITON = '''
import sys

class NoTriton:
    """A machine without Triton: importing it fails as a missing package does."""
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTriton())
'''

CHECKS = '''
import contextlib, io, threading, time
import pytest

with pytest.raises(ImportError):
    import triton  # noqa: F401

import minilm, widgets  # noqa: E401
from minilm import Engine, make_workload
from minilm.config import InvalidValue
from minilm.sim import simulated_engine

engine = Engine("tiny", max_num_seqs=4)
engine.add_workload(make_workload("mixed", num_requests=6, vocab_size=engine.model_config.vocab_size,
                                  max_model_len=256), ignore_eos=True)
assert len(engine.run().requests) == 6 and engine.config.attention_backend == "sdpa"
sim = simulated_engine("llama-3-8b", "h100", policy="chunked")
sim.add_workload(make_workload("mixed", num_requests=6, vocab_size=sim.model_config.vocab_size))
assert len(sim.run().requests) == 6
widgets.gantt_figure(sim.timeline)

with pytest.raises(InvalidValue, match="needs triton, which is not installed here; allowed here: reference, sdpa"):
    Engine("tiny", attention_backend="triton")

# a server, over real HTTP
import httpx, uvicorn
from minilm.config import EngineConfig
from minilm.model.loader import resolve_model_path
from minilm.model.tokenizer import load_tokenizer
from minilm.serve.engine_core import ProcessEngineClient
from minilm.serve.metrics import ServerMetrics
from minilm.serve.process import free_port
from minilm.serve.server import create_app

port = free_port()
client = ProcessEngineClient("docstrings", EngineConfig(), ServerMetrics("docstrings"))  # its own process: no Triton there either
app = create_app(client, "docstrings", load_tokenizer(resolve_model_path("docstrings")))
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
threading.Thread(target=server.run, daemon=True).start()
while not server.started:
    time.sleep(0.05)
reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "Return the", "max_tokens": 4},
                   timeout=60)
assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1, reply.text
server.should_exit = True

# lesson 5, every code cell in order, as the notebook runs them
sys.path.insert(0, str(ROOT / "labs"))
from build_notebooks import SETUP, split_cells

namespace = {}
out = io.StringIO()
with contextlib.redirect_stdout(out):
    exec(SETUP, namespace)
    for kind, source in split_cells((ROOT / "labs" / "src" / "05_triton_kernel.py").read_text()):
        if kind != "markdown":
            exec(source, namespace)
printed = out.getvalue()
assert "Triton is not installed here" in printed, printed
assert printed.count("not installed here: skipped") == 4, printed
print("ok")
'''


def test_the_lab_runs_where_triton_cannot_be_imported():
    script = NO_TRITON + f"ROOT = __import__('pathlib').Path({str(ROOT)!r})\n" + textwrap.dedent(CHECKS)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout[-3000:] + result.stderr[-3000:]
