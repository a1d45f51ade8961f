"""Sentences whose numbers come from code.

A lesson never types a measured or computed number into its prose: an engine change
would leave the text stale. A sentence that states one is rendered from the value:

    say(f"The prompt is cut into **{num_chunks}** chunks.")

as the last line of a cell. Jupyter shows it as Markdown; its plain-text form is the
sentence itself, so where the number is deterministic (the simulated clock) a
`# NBVAL_CHECK_OUTPUT` cell stores it and nbval checks it on every run.
tests/test_lessons.py fails on a number in a markdown cell that no code produces.
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
