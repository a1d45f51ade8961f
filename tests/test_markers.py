"""scripts/markers.py writes generated text between a page's markers, and labs/README.md's
lesson times (scripts/lesson_times.py --write) cover every lesson there is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from markers import markers, write_between  # noqa: E402


def test_write_between_replaces_only_the_marked_text(tmp_path):
    page = tmp_path / "page.md"
    begin, end = markers("figures")
    page.write_text(f"intro\n{begin}\nold table\n{end}\noutro\n")
    write_between(page, "figures", "| new |")
    assert page.read_text() == f"intro\n{begin}\n| new |\n{end}\noutro\n"
    write_between(page, "figures", "| newer |")  # again: the markers stay, once each
    assert page.read_text() == f"intro\n{begin}\n| newer |\n{end}\noutro\n"


@pytest.mark.parametrize(
    "text",
    ["no markers", "<!-- figures: end -->\n<!-- figures: begin -->", "<!-- figures: begin -->"],
)
def test_write_between_refuses_a_page_without_its_markers(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match="figures: begin"):
        write_between(page, "figures", "| new |")
    assert page.read_text() == text  # unchanged


def test_the_lesson_times_cover_every_lesson():
    begin, end = markers("lesson times")
    readme = (ROOT / "labs" / "README.md").read_text()
    table = readme.split(begin)[1].split(end)[0]
    lessons = [
        s.stem for s in sorted((ROOT / "labs" / "src").glob("*.py")) if not s.name.startswith("ex_")
    ]
    timed = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert timed == lessons, "run `python scripts/lesson_times.py --write`"
