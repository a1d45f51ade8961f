"""Lessons are held to the engine's standard: a number a lesson states comes from code.

A markdown cell may hold numbers only where they are not measurements or results:
headings, lesson / exercise / section numbers, years, list markers and table row
labels, the small integers 0-2, names (Llama-3-8B, H100, fp16), code spans and math
(formulas and knob values the cells show), and blockquotes, which the lessons keep for
results cited from papers and docs as theirs. Any other number must be rendered by
code (`labs/prose.py`'s `say`), so an engine change cannot leave the prose stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

LABS = Path(__file__).resolve().parent.parent / "labs"
sys.path.insert(0, str(LABS))
from build_notebooks import markdown_text, split_cells, unshown_says  # noqa: E402

SOURCES = sorted((LABS / "src").glob("*.py"))
NOTEBOOKS = sorted(
    [*LABS.glob("*.ipynb"), *LABS.glob("exercises/*.ipynb"), *LABS.glob("solutions/*.ipynb")]
)
NUMBER = re.compile(r"(?<![\w.\-])\d[\d,.]*(?![A-Za-wyz\d])(?:\s?[%x×])?")
ALLOWED = [
    (re.compile(r"`[^`]*`"), "code span"),
    (re.compile(r"\$\$.*?\$\$", re.S), "display math"),
    (re.compile(r"\$[^$]*\$"), "math"),
    (re.compile(r"\]\([^)]*\)"), "link target"),
    (
        re.compile(
            r"(?:\b(?:[Ll]essons?|[Ee]xercises?|[Ss]ections?|[Pp]arts?|[Ss]ources?)\s*|§\s*)"
            r"\d+(?:\s*(?:,|and|or|–|-)\s*\d+)*"
        ),
        "lesson, section or source number",
    ),
    (re.compile(r"\b(?:19|20)\d\d\b"), "year"),
    (re.compile(r"^\s*(?:\*\*)?\d+\.\s", re.M), "list marker"),
    (re.compile(r"^\|\s*\d+\s*\|", re.M), "table row label"),
]


def unbacked_numbers(markdown: str) -> list[str]:
    """Numbers in a markdown cell that no rule above allows."""
    lines = [line for line in markdown.splitlines() if not line.lstrip().startswith(("#", ">"))]
    text = "\n".join(lines)
    for pattern, _ in ALLOWED:
        text = pattern.sub(" ", text)
    return [m.group() for m in NUMBER.finditer(text) if m.group().strip() not in ("0", "1", "2")]


def test_the_rules_catch_typed_in_numbers():
    assert unbacked_numbers("cut into 16 chunks; 36% empty, 3.63x faster, 989 TFLOP/s") == [
        "16",
        "36%",
        "3.63x",
        "989",
    ]
    assert (
        unbacked_numbers(
            "## 2. Lesson 5 and exercise 3 (2024): Llama-3-8B on an H100, `max_num_seqs=16`, "
            "$2 \\cdot N$, one of 2 rows, see §3 and source 001\n$$\nx = 24 N\n$$\n"
            "> vLLM reports 2–4x\n1. first"
        )
        == []
    )


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_no_number_in_prose_that_code_does_not_produce(src):
    found = [
        (n, source[:60])
        for kind, source in split_cells(src.read_text())
        if kind == "markdown"
        for n in unbacked_numbers(markdown_text(source))
    ]
    assert not found, (
        f"{src.name}: numbers typed into prose (render them with say(), see labs/prose.py): {found}"
    )


def takeaway_cells(src: Path) -> list[str]:
    from build_notebooks import states_a_takeaway

    return [
        source
        for kind, source in split_cells(src.read_text())
        if kind != "markdown" and states_a_takeaway(source)
    ]


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_a_takeaway_cell_shows_only_its_sentence(src):
    """A cell ending in say() is shown without its source (build_notebooks.py), so it must not
    also print a table or draw a figure: that output would appear with its code hidden."""
    bad = [
        source.splitlines()[0][:60]
        for source in takeaway_cells(src)
        if re.search(r"^\s*print\(|\bfig\b|display\(", source, re.M)
    ]
    assert not bad, f"{src.name}: cells that say() and also print or draw (split them): {bad}"


def test_takeaway_cells_are_hidden_in_the_built_notebooks():
    import nbformat
    from build_notebooks import targets

    for src in SOURCES:
        for path, _ in targets(src):
            if not path.exists():
                continue
            for cell in nbformat.read(path, as_version=4).cells:
                if cell.cell_type == "code" and cell.source in takeaway_cells(src):
                    assert cell.metadata.get("jupyter", {}).get("source_hidden"), (
                        f"{path.name}: a say() cell whose source is not hidden: rebuild it"
                    )


def test_the_rule_finds_a_say_that_shows_nothing():
    assert unshown_says("x = 1\nsay(f'{x}')") == []
    assert unshown_says("if a:\n    sentence = 'x'\nelse:\n    sentence = 'y'\nsay(sentence)") == []
    assert unshown_says("say(check('000', 'claim', 'verdict'))") == []
    assert (
        unshown_says("await server.start()\nsay('up')") == []
    )  # top-level await, as a kernel allows
    assert unshown_says("if a:\n    say('x')\nelse:\n    say('y')") == [2, 4]
    assert unshown_says("for i in r:\n    say('x')") == [2]
    assert unshown_says("def f():\n    say('x')\nf()") == [2]
    assert unshown_says("say('x')\nprint(1)") == [1]
    assert unshown_says("sentence = say('x')") == [1]
    assert unshown_says("%timeit f()\nsay('x')") == [
        1
    ]  # IPython-only syntax: cannot tell, so refused


def test_the_build_refuses_a_cell_that_would_show_nothing(tmp_path):
    from build_notebooks import build, keep_checked_outputs, make_notebook

    src = tmp_path / "99_unshown.py"
    src.write_text("# %%\nif True:\n    say('x')\n")
    with pytest.raises(SystemExit, match="shows nothing"):
        build(src)  # refused before it runs
    nb = make_notebook(
        [("code", "# NBVAL_CHECK_OUTPUT\nx = 1")], "lesson"
    )  # as executed: it prints nothing
    assert any("shows no text" in e for e in keep_checked_outputs(nb, "lesson"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(LABS)))
def test_every_say_and_every_checked_cell_shows_something(path):
    """A say() shows its sentence only as its cell's last statement; a cell marked NBVAL_CHECK_OUTPUT
    with no stored output checks nothing (nbval compares the empty output with the empty one)."""
    import nbformat

    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    unshown = [
        (c.source.splitlines()[0][:50], line) for c in cells for line in unshown_says(c.source)
    ]
    assert not unshown, (
        f"{path.name}: say() calls that show nothing (end the cell with say(sentence)): {unshown}"
    )
    empty = [
        c.source.splitlines()[1][:50]
        for c in cells
        if "NBVAL_CHECK_OUTPUT" in c.source and not c.outputs
    ]
    assert not empty, f"{path.name}: cells marked NBVAL_CHECK_OUTPUT that store no output: {empty}"
