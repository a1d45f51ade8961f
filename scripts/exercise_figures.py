"""Per exercise: its graded parts and the lines of the reference answer, as docs/EXERCISES.md shows them.

    python scripts/exercise_figures.py           # print the table
    python scripts/exercise_figures.py --write   # and put it in docs/EXERCISES.md, between its markers

A graded part is a call of a `checks.check_*` function in the solution notebook. The reference
answer is what the solution notebook (labs/solutions/) has where the exercise notebook
(labs/exercises/) has `raise NotImplementedError`: the lines of each code cell that only the
solution has, blank lines and comment-only lines not counted. The difficulty (1 to 5) is an
estimate, written here by hand, not measured: DIFFICULTY says whose.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import nbformat
from markers import write_between

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
DOC = ROOT / "docs" / "EXERCISES.md"

# the author's estimate of each exercise's hardest graded part (issue 29), 1 (transcribe) to 5;
# no fresh attempt measured these
DIFFICULTY = {
    "00": 3,
    "01": 3,
    "02": 3,
    "03": 4,
    "04": 3,
    "05": 4,
    "06": 4,
    "07": 4,
    "08": 4,
    "09": 3,
    "10": 4,
    "11": 4,
}


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def answer_lines(exercise: Path, solution: Path) -> int:
    """Lines of code the solution adds where the exercise raises NotImplementedError."""
    count = 0
    for stub, full in zip(code_cells(exercise), code_cells(solution), strict=True):
        a, b = stub.splitlines(), full.splitlines()
        for op, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if op in ("insert", "replace"):
                count += sum(
                    1 for line in b[j1:j2] if line.strip() and not line.strip().startswith("#")
                )
    return count


def rows() -> list[tuple[str, int, int, int]]:
    out = []
    for solution in sorted((LABS / "solutions").glob("*.ipynb")):
        number = solution.name[:2]
        checks = sum(len(re.findall(r"\bchecks\.check_\w+\(", c)) for c in code_cells(solution))
        out.append(
            (
                solution.stem,
                checks,
                answer_lines(LABS / "exercises" / solution.name, solution),
                DIFFICULTY.get(number, "not rated"),
            )
        )
    return out


def table() -> str:
    lines = [
        "| exercise | graded parts | reference answer (lines) | difficulty of the hardest part (1-5, author's estimate) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| `{name}` | {parts} | {n} | {d} |" for name, parts, n, d in rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    text = table()
    print(text)
    if "--write" in sys.argv:
        write_between(DOC, "exercise figures", text)
