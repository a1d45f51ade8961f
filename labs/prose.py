"""Sentences whose numbers come from code.

A lesson never types a measured or computed number into its prose: an engine change
would leave the text stale. A sentence that states one is rendered from the value:

    say(f"The prompt is cut into **{num_chunks}** chunks.")

as the last line of a cell. Jupyter shows it as Markdown; its plain-text form is the
sentence itself, so where the number is deterministic (the simulated clock) a
`# NBVAL_CHECK_OUTPUT` cell stores it and nbval checks it on every run.
tests/test_lessons.py fails on a number in a markdown cell that no code produces.
labs/build_notebooks.py hides the source of a cell whose last statement is `say(...)`:
the learner reads the sentence once. Where a lesson checks a claim of one of its
sources, `check` renders claim and verdict as one callout box.
"""

from __future__ import annotations


class Prose:
    def __init__(self, text: str):
        self.text = text

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def say(text: str) -> Prose:
    return Prose(text)


def check(source: str, claim: str, verdict: str) -> str:
    """One source's claim and what the lab measured, as one callout box (a Markdown blockquote):

        say(check("000", "prefill FLOPs ≈ 2·N·L·d²", f"the counter says **{factor:.0f}x** more"))

    A check whose verdict has no computed number is written as the same blockquote in a
    markdown cell."""
    return f"> **Source {source}, checked.** {claim}\n>\n> {verdict}"
