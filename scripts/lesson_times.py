"""How long each lesson runs, as labs/README.md shows it: every lesson and the lecture demo
executed once, as labs/build_notebooks.py executes them, without writing the notebooks.

    python scripts/lesson_times.py           # time every lesson and print the table
    python scripts/lesson_times.py 03 07b    # only the lessons whose source starts so
    python scripts/lesson_times.py --write   # every lesson, the table put in labs/README.md

Wall time depends on what else the machine runs, so the table states the machine and its load
average (the last minute's, read before the first lesson and after each one); the kernel's CPU
time (its process and the servers it started, once they have exited) depends on it less.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
sys.path.insert(0, str(LABS))
from build_notebooks import SRC, execute, keep_checked_outputs, make_notebook, split_cells  # noqa: E402
from markers import write_between  # noqa: E402

README = LABS / "README.md"


def lessons(prefixes: list[str]) -> list[Path]:
    chosen = [
        s
        for s in sorted(SRC.glob("*.py"))
        if not s.name.startswith("ex_") and (not prefixes or s.stem.startswith(tuple(prefixes)))
    ]
    if not chosen:
        raise SystemExit(f"no lesson source in {SRC} starts with {prefixes}")
    return chosen


def words(src: Path) -> int:
    from build_notebooks import markdown_text

    return sum(
        len(markdown_text(s).split())
        for kind, s in split_cells(src.read_text())
        if kind == "markdown"
    )


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_lesson(src: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one execution of the lesson's notebook."""
    nb = make_notebook(split_cells(src.read_text()), "lesson")
    cpu = children_cpu()
    wall = execute(nb, LABS)
    errors = keep_checked_outputs(nb, "lesson")
    if errors:
        raise SystemExit(f"{src.name} failed, so its time means nothing:\n  " + "\n  ".join(errors))
    return wall, children_cpu() - cpu


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def table(rows: list[tuple[str, float, float, int]], loads: list[float]) -> str:
    machine = (
        f"{os.cpu_count()} cores of an {cpu_model()} ({platform.machine()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, one torch thread"
    )
    lines = [
        f"Measured by `scripts/lesson_times.py` on {machine}; load average "
        f"{loads[0]:.1f} before the first lesson, {min(loads[1:]):.1f} to {max(loads[1:]):.1f} "
        "after each.",
        "",
        "| notebook | wall (s) | CPU (s) | markdown (words) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| `{name}` | {wall:.0f} | {cpu:.0f} | {n:,} |" for name, wall, cpu, n in rows]
    lines.append(
        f"| all of the above | {sum(r[1] for r in rows):.0f} | {sum(r[2] for r in rows):.0f} | "
        f"{sum(r[3] for r in rows):,} |"
    )
    return "\n".join(lines)


def main(args: list[str]) -> None:
    prefixes = [a for a in args if not a.startswith("--")]
    if "--write" in args and prefixes:
        raise SystemExit(f"--write times every lesson; drop {prefixes}")
    rows, loads = [], [os.getloadavg()[0]]
    for src in lessons(prefixes):
        wall, cpu = time_lesson(src)
        loads.append(os.getloadavg()[0])
        rows.append((src.stem, wall, cpu, words(src)))
        print(f"{src.stem}: {wall:.1f} s wall, {cpu:.1f} s CPU, load {loads[-1]:.1f}", flush=True)
    text = table(rows, loads)
    print(text)
    if "--write" in args:
        write_between(README, "lesson times", text)


if __name__ == "__main__":
    main(sys.argv[1:])
