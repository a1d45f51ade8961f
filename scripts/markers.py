"""Generated text in a document, between a pair of markers that a script owns:

    <!-- exercise figures: begin -->
    ...what scripts/exercise_figures.py --write put here...
    <!-- exercise figures: end -->

Every figure a page shows is computed by code; the page keeps the markers and its own prose.
"""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def write_between(path: Path, name: str, text: str) -> None:
    """Replace what stands between `name`'s markers in `path` by `text`."""
    begin, end = markers(name)
    doc = path.read_text()
    if doc.count(begin) != 1 or doc.count(end) != 1 or doc.index(begin) > doc.index(end):
        raise ValueError(f"{path} must hold {begin!r} once, then {end!r} once")
    head, rest = doc.split(begin)
    _, tail = rest.split(end)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}")
