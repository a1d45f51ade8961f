"""Build the lab's notebooks from the readable Python sources in `labs/src/`.

    .venv/bin/python labs/build_notebooks.py            # build and execute every notebook
    .venv/bin/python labs/build_notebooks.py 03 ex03    # only sources whose name starts so

Sources use the "percent" format: a line `# %%` starts a code cell, `# %% [markdown]`
a markdown cell whose lines start with `# `. Every notebook gets the same setup cell
first (find the repository root); `# %% [with setup]` puts the setup at the
top of that cell instead (the lecture demo, whose first cell must do everything).

Exercise sources (`src/ex_NN_*.py`) give two notebooks: `exercises/NN_*.ipynb`, where
each `# BEGIN SOLUTION ... # END SOLUTION` region becomes `raise NotImplementedError`,
and `solutions/NN_*.ipynb` with the code in place. Cells that start with
`# exercise check` call `labs/checks.py`; in the exercise notebook they are marked
`# NBVAL_RAISES_EXCEPTION`, so nbval insists that an unsolved exercise fails; in the
solution they are `# NBVAL_CHECK_OUTPUT`, so nbval compares their "passed" line.

A code cell whose last statement is a call to `say(...)` (labs/prose.py) states a
takeaway: its source is hidden (`"jupyter": {"source_hidden": true}` in the cell's
metadata, which JupyterLab and Notebook 7 read: a collapsed input, one click to open),
so the learner reads the rendered sentence once, not also as an f-string. Such a cell
holds only the sentence and what computes its numbers (asserts included); a cell that
runs an experiment or prints a table shows its code. A kernel displays only a cell's
last statement, so a say() anywhere else (in an if/else, a loop, a function) would show
nothing: the build refuses it. A cell whose sentence depends on a branch sets
`sentence` in each branch and ends with `say(sentence)`.

Each notebook is executed once here, and only the outputs of cells marked
`# NBVAL_CHECK_OUTPUT` (their text, never figures) are stored: that is what nbval
compares; everything else is stripped to keep the repository small. A marked cell that
shows no text is an error: nbval would have nothing to compare. A cell that starts with
`# %% [stored]` is deterministic (the simulated clock, arithmetic: never a CPU
measurement) and keeps what it shows, figures included, so that a reader who opens the
notebook before running it sees them; nbval (`--nbval-lax`) does not compare them. To keep
the repository small a cell may store 32 KB of JSON (STORED_LIMIT); more is an error.

The lab as a website, every notebook executed with its figures, for a reader without a
kernel: `bash scripts/site.sh` (labs/build_site.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

LABS = Path(__file__).resolve().parent
SRC = LABS / "src"

SETUP = """\
# Setup: put the repository root on the path, so that `import minilm` and the
# exercises' `from labs import checks` work from any folder.
import pathlib, sys
ROOT = next(p for p in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents) if (p / "minilm").is_dir())
sys.path.insert(0, str(ROOT))
import torch"""

SOLUTION = re.compile(r"^([ \t]*)# BEGIN SOLUTION\n.*?^[ \t]*# END SOLUTION\n", re.M | re.S)
CHECK_MARK = "# exercise check"


def split_cells(text: str) -> list[tuple[str, str]]:
    """[(kind, source)] from a percent-format script."""
    cells, kind, lines = [], None, []
    for line in text.splitlines():
        if line.startswith("# %%"):
            if kind is not None:
                cells.append((kind, "\n".join(lines).strip("\n")))
            kind = (
                "markdown"
                if "[markdown]" in line
                else "setup+code"
                if "[with setup]" in line
                else "stored"
                if "[stored]" in line
                else "code"
            )
            lines = []
        elif kind is not None:
            lines.append(line)
    if kind is not None:
        cells.append((kind, "\n".join(lines).strip("\n")))
    return [(k, s) for k, s in cells if s]


def parse_cell(source: str) -> ast.Module | None:
    """A code cell's syntax tree, top-level `await` allowed as in a kernel; None for IPython-only syntax."""
    try:
        return compile(
            source, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
    except SyntaxError:
        return None


def is_say(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "say"


def states_a_takeaway(source: str) -> bool:
    """Whether a code cell's last statement is `say(...)`: a sentence whose source is hidden."""
    tree = parse_cell(source)
    last = tree.body[-1] if tree and tree.body else None
    return isinstance(last, ast.Expr) and is_say(last.value)


def unshown_says(source: str) -> list[int]:
    """Lines of the cell's say(...) calls whose sentence nothing displays. A kernel shows only the
    value of a cell's last statement, so a say() inside an if/else, a loop or a function, or before
    the last statement, renders nothing: compute the sentence, then end the cell with say(sentence)."""
    tree = parse_cell(source)
    if tree is None:
        return (
            [1] if "say(" in source else []
        )  # IPython-only syntax: nothing can tell where say() stands
    shown = tree.body[-1].value if states_a_takeaway(source) else None
    return [node.lineno for node in ast.walk(tree) if is_say(node) and node is not shown]


HIDDEN = {"jupyter": {"source_hidden": True}}
STORED = "stored"  # the tag of a `# %% [stored]` cell: its outputs stay in the notebook
STORED_LIMIT = (
    32_000  # characters of JSON: a figure of a few hundred points, not a run's every step
)
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def markdown_text(source: str) -> str:
    return "\n".join(
        line[2:] if line.startswith("# ") else line.lstrip("#") for line in source.splitlines()
    )


def stub(source: str) -> str:
    """Replace each solution region by a NotImplementedError at the same indentation."""
    return SOLUTION.sub(
        lambda m: f'{m.group(1)}raise NotImplementedError("exercise: write this part")\n',
        source + "\n",
    ).rstrip("\n")


def solution(source: str) -> str:
    return "\n".join(
        line
        for line in source.splitlines()
        if line.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION")
    )


def make_notebook(cells: list[tuple[str, str]], variant: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    inline = any(kind == "setup+code" for kind, _ in cells)
    out = [] if inline else [nbformat.v4.new_code_cell(SETUP)]
    for kind, source in cells:
        if kind == "setup+code":  # the lecture demo: its first cell must do everything
            source = SETUP + "\n\n" + source
        if kind == "markdown":
            out.append(nbformat.v4.new_markdown_cell(markdown_text(source)))
            continue
        if variant == "exercise":
            source = stub(source)
            if source.startswith(CHECK_MARK):
                source = "# NBVAL_RAISES_EXCEPTION\n" + source
        elif variant == "solution":
            source = solution(source)
            if source.startswith(CHECK_MARK):  # the check prints one deterministic line
                source = "# NBVAL_CHECK_OUTPUT\n" + source
        cell = nbformat.v4.new_code_cell(source)
        if kind == "stored":
            cell.metadata["tags"] = [STORED]
        if states_a_takeaway(source):
            cell.metadata.update(HIDDEN)
        out.append(cell)
    for i, cell in enumerate(out):
        cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding does not churn the diff
    nb.cells = out
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path) -> float:
    # the kernel runs one torch thread (EngineConfig.cpu_threads's default is $OMP_NUM_THREADS):
    # on the shared 2-core machine that builds the notebooks, more threads wait on each other
    # and the lessons' measured times turn erratic
    os.environ["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(cwd)}},
    ).execute()
    return time.perf_counter() - t0


def keep_checked_outputs(nb: nbformat.NotebookNode, variant: str) -> list[str]:
    """Strip every output except the text of NBVAL_CHECK_OUTPUT cells; return unexpected errors."""
    errors = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for o in cell.get("outputs", []):
            if o.output_type == "error" and "NBVAL_RAISES_EXCEPTION" not in cell.source:
                errors.append(f"cell {i}: {o.ename}: {o.evalue}")
        if "# NBVAL_CHECK_OUTPUT" in cell.source:
            kept = []
            for o in cell.outputs:
                if o.output_type == "stream" and o.name == "stdout":
                    if (
                        kept and kept[-1].output_type == "stream"
                    ):  # one text, however the kernel chunked it
                        kept[-1].text += o.text
                    else:
                        kept.append(o)
                elif o.output_type == "execute_result" and "text/plain" in o.data:
                    # text, and the Markdown of a sentence rendered by say(): nbval compares every field
                    o.data = {
                        k: v for k, v in o.data.items() if k in ("text/plain", "text/markdown")
                    }
                    o.metadata = {}
                    kept.append(o)
            cell.outputs = kept
            if not kept:
                errors.append(
                    f"cell {i}: marked NBVAL_CHECK_OUTPUT but shows no text, so nbval would compare nothing"
                )
        elif STORED in cell.metadata.get("tags", ()):
            cell.outputs = stored_outputs(cell.outputs)
            size = len(json.dumps(cell.outputs))
            if not cell.outputs:
                errors.append(f"cell {i}: marked [stored] but shows nothing to store")
            elif size > STORED_LIMIT:
                errors.append(
                    f"cell {i}: marked [stored] but shows {size / 1e3:.0f} KB, over the "
                    f"{STORED_LIMIT / 1e3:.0f} KB a cell may store: leave it unstored"
                )
        else:
            cell.outputs = []
            cell.execution_count = None
        cell.metadata = {
            k: v for k, v in cell.metadata.items() if k in HIDDEN or k == "tags"
        }  # not nbclient's timings
    nb.metadata.pop(
        "widgets", None
    )  # the saved state of every widget shown: megabytes of figure JSON
    return errors


def stored_outputs(outputs: list) -> list:
    """What a [stored] cell keeps: its printed text and what it displayed (a figure as its Plotly
    JSON only, which JupyterLab draws: no copy of plotly.js), not stderr nor live widgets, whose
    state is not saved."""
    kept = []
    for o in outputs:
        if o.output_type == "stream" and o.name == "stdout":
            if kept and kept[-1].output_type == "stream":
                kept[-1].text += o.text
            else:
                kept.append(o)
        elif o.output_type in ("execute_result", "display_data"):
            keys = [PLOTLY_MIME] if PLOTLY_MIME in o.data else ["text/html", "text/markdown"]
            data = {k: v for k, v in o.data.items() if k in (*keys, "text/plain")}
            if "application/vnd.jupyter.widget-view+json" not in o.data:
                o.data, o.metadata = data, {}
                kept.append(o)
    return kept


def targets(src: Path) -> list[tuple[Path, str]]:
    """(notebook path, variant) pairs a source file produces."""
    if src.name.startswith("ex_"):
        name = src.stem[3:] + ".ipynb"
        return [(LABS / "exercises" / name, "exercise"), (LABS / "solutions" / name, "solution")]
    return [(LABS / (src.stem + ".ipynb"), "lesson")]


def build(src: Path) -> None:
    cells = split_cells(src.read_text())
    unshown = [
        f"line {line} of the cell that starts {source.splitlines()[0][:50]!r}"
        for kind, source in cells
        if kind != "markdown"
        for line in unshown_says(source)
    ]
    if unshown:  # checked before the slow execution
        raise SystemExit(
            f"{src.name}: a say() that is not its cell's last statement shows nothing "
            f"({'; '.join(unshown)}): compute the sentence, then end the cell with say(sentence)"
        )
    for path, variant in targets(src):
        path.parent.mkdir(exist_ok=True)
        nb = make_notebook(cells, variant)
        seconds = execute(nb, path.parent)
        errors = keep_checked_outputs(nb, variant)
        nbformat.write(nb, path)
        status = "ok" if not errors else "ERRORS:\n  " + "\n  ".join(errors)
        print(f"{path.relative_to(LABS)}: executed in {seconds:.1f} s, {status}")
        if errors:
            raise SystemExit(1)


def main(prefixes: list[str]) -> None:
    sources = sorted(SRC.glob("*.py"))
    chosen = [s for s in sources if not prefixes or any(s.stem.startswith(p) for p in prefixes)]
    if not chosen:
        raise SystemExit(
            f"no source in {SRC} starts with {prefixes}; have {[s.stem for s in sources]}"
        )
    for src in chosen:
        build(src)


if __name__ == "__main__":
    main(sys.argv[1:])
