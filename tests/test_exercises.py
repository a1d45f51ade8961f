"""The lab's exercises: every stub fails cleanly, every solution passes its checks.

Each exercise notebook (labs/exercises/) ships with `raise NotImplementedError` where
the learner writes code; its check cells (marked NBVAL_RAISES_EXCEPTION) must raise
exactly that, so an unsolved exercise can never pass by accident. The solution
notebooks (labs/solutions/) run the same checks (labs/checks.py) and must pass.
The notebooks' code cells run here in-process, in order, like a kernel would.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import nbformat
import pytest
import torch

LABS = Path(__file__).resolve().parent.parent / "labs"
EXERCISES = sorted((LABS / "exercises").glob("*.ipynb"))
SOLUTIONS = sorted((LABS / "solutions").glob("*.ipynb"))


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    n = torch.get_num_threads()  # an Engine on CPU sets the thread count (EngineConfig.cpu_threads)
    yield
    torch.set_num_threads(n)


def test_every_exercise_has_a_solution():
    assert EXERCISES, "no exercise notebooks found"
    assert [p.name for p in EXERCISES] == [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_stub_raises_not_implemented(path):
    namespace: dict = {}
    checks = 0
    for source in code_cells(path):
        if source.startswith("# NBVAL_RAISES_EXCEPTION"):
            checks += 1
            with pytest.raises(NotImplementedError):
                exec(compile(source, f"{path.name}:check", "exec"), namespace)
        else:
            exec(compile(source, path.name, "exec"), namespace)
    assert checks, f"{path.name} has no check cell"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_passes_checks(path):
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in code_cells(path):
            exec(compile(source, path.name, "exec"), namespace)
    assert "passed:" in out.getvalue(), f"{path.name}: no check reported success"


def test_notebooks_match_their_sources():
    """Every notebook is built from labs/src/ by labs/build_notebooks.py: edit the source, rebuild."""
    sys.path.insert(
        0, str(LABS.parent)
    )  # `labs` is a folder of the repository, not an installed package
    from labs import build_notebooks as b

    sources = sorted(b.SRC.glob("*.py"))
    assert sources
    for src in sources:
        cells = b.split_cells(src.read_text())
        for path, variant in b.targets(src):
            want = [c.source for c in b.make_notebook(cells, variant).cells]
            have = [c.source for c in nbformat.read(path, as_version=4).cells]
            assert have == want, (
                f"{path.relative_to(LABS)} is stale: run .venv/bin/python labs/build_notebooks.py"
            )
