"""The lab without Triton, as on a Mac (Triton publishes wheels for Linux only), proven here on
Linux. Every Python process these tests start has `import triton` fail: a `sitecustomize.py`
on PYTHONPATH (Python imports it at startup, before any other code) installs a finder that
refuses the package, and every process inherits PYTHONPATH, so the block reaches the child,
the engine's server process, the nested pytest that runs nbval and the notebooks' Jupyter
kernels, which are processes of their own. (A meta-path finder set up inside the child alone
would not reach the processes it starts.)

Without Triton the lab imports minilm and widgets, runs the engine and the simulator, serves a
request over HTTP and refuses the Triton backend with a clear error; and the kernel's notebooks
pass nbval exactly as scripts/test.sh runs it, each checked cell that runs the kernel showing a
one-line reason instead of its stored output and skipped by ./conftest.py with that reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "labs"))
from build_notebooks import SRC, split_cells, targets  # noqa: E402

NO_TRITON = '''"""sitecustomize: this machine has no Triton, as a Mac (tests/test_without_triton.py)."""
import sys

class NoTriton:
    """A machine without Triton: importing it fails as a missing package does."""
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTriton())
'''

CHECKS = """
import threading, time
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
from minilm.client.process import free_port
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

print("ok")
"""


@pytest.fixture(scope="module")
def no_triton(tmp_path_factory) -> dict[str, str]:
    """The environment of a process, and of every process it starts, in which `import triton` fails."""
    site = tmp_path_factory.mktemp("no_triton")
    (site / "sitecustomize.py").write_text(NO_TRITON)
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
    }


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_lab_runs_where_triton_cannot_be_imported(no_triton):
    result = run([sys.executable, "-c", CHECKS], no_triton)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        result.stdout[-3000:] + result.stderr[-3000:]
    )


def kernel_notebooks() -> list[Path]:
    """The notebooks of every source named for the kernel or whose code touches Triton."""
    sources = [
        src
        for src in sorted(SRC.glob("*.py"))
        if "triton" in src.stem
        or any(
            kind != "markdown" and "triton" in source.lower()
            for kind, source in split_cells(src.read_text())
        )
    ]
    return [path for src in sources for path, _ in targets(src)]


RUN_CELLS = '''
"""Each notebook's code cells in order, as a kernel runs them; print what each checked cell shows."""
import ast, contextlib, io, json, sys
import nbformat

def shows(source, namespace):
    """What a kernel shows for a cell: what it prints, then the value of its last statement."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(tree, "<cell>", "exec"), namespace)
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace) if last else None
            if value is not None:
                print(repr(value))
        except Exception as e:  # an exercise's stub: the kernel shows the error and runs on
            print(f"{type(e).__name__}: {e}")
    return out.getvalue().strip()

shown = {}
for path in sys.argv[1:]:
    namespace = {}
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    every = [shows(s, namespace) for s in cells]  # every cell runs, in order: later ones use earlier names
    shown[path] = {i: every[i] for i, s in enumerate(cells) if "NBVAL_CHECK_OUTPUT" in s}
print(json.dumps(shown))
'''


def stored_text(cell) -> str:
    return "".join(
        o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs
    ).strip()


def skipped_cells(report: Path) -> dict[str, dict[int, str]]:
    """{notebook: {code cell number: skip reason}} from pytest's JUnit XML report of an nbval run."""
    skipped = {}
    for case in ET.parse(report).iter("testcase"):
        if not case.get("name").startswith("Cell "):
            continue  # conftest.py's figure check after each notebook's cells is not a cell
        for skip in case.iter("skipped"):
            notebook = case.get("classname").split(".ipynb")[0].replace(".", "/") + ".ipynb"
            skipped.setdefault(notebook, {})[int(case.get("name").split()[-1])] = skip.get(
                "message"
            )
    return skipped


def test_the_kernel_notebooks_pass_nbval_where_triton_cannot_be_imported(no_triton, tmp_path):
    notebooks = [str(p.relative_to(ROOT)) for p in kernel_notebooks()]
    assert "labs/05_triton_kernel.ipynb" in notebooks, notebooks
    # Without Triton, which checked cells show something other than their stored output?
    result = run([sys.executable, "-c", RUN_CELLS, *notebooks], no_triton)
    assert result.returncode == 0, result.stderr[-3000:]
    differ = {}
    for notebook, shown in json.loads(result.stdout.splitlines()[-1]).items():
        cells = [
            c for c in nbformat.read(ROOT / notebook, as_version=4).cells if c.cell_type == "code"
        ]
        differ[notebook] = {
            int(i): text for i, text in shown.items() if text != stored_text(cells[int(i)])
        }
    assert differ["labs/05_triton_kernel.ipynb"], "no checked cell of lesson 5 runs the kernel?"
    for notebook, cells in differ.items():
        for (
            i,
            text,
        ) in cells.items():  # the Triton-missing variant of a checked cell says why it skips
            assert "not installed here" in text, (
                f"{notebook} code cell {i} shows, without Triton: {text!r}"
            )
    # nbval as scripts/test.sh runs it: those cells, and only those, are skipped by ./conftest.py with its reason
    report = tmp_path / "nbval.xml"
    result = run(
        [sys.executable, "-m", "pytest", "-q", "--nbval-lax", f"--junitxml={report}", *notebooks],
        no_triton,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    skipped = skipped_cells(report)
    for notebook in notebooks:
        assert set(skipped.get(notebook, {})) == set(differ[notebook]), (
            f"{notebook}: nbval skipped code cells {sorted(skipped.get(notebook, {}))}, "
            f"but without Triton these show other than their stored output: {sorted(differ[notebook])}"
        )
        for i, reason in skipped.get(notebook, {}).items():
            assert "Triton is not installed here" in reason, (
                f"{notebook} code cell {i} skipped for: {reason!r}"
            )
