"""The padded-vs-ragged attention figure counts the cells each layout computes, exactly."""

from __future__ import annotations

import numpy as np

from minilm.timeline import StepItem, StepRecord
from widgets.masks import (
    NEEDED,
    NOT_COMPUTED,
    WASTED,
    mask_counts,
    mask_grids,
    masks_figure,
    sequence_ticks,
)

# a decode with 7 keys, a 3-token chunk continuing a prompt (5 keys after it), a whole 4-token prompt,
# and a padding item and a cached prefix, which are not attention work of the step
ITEMS = [
    StepItem("d", "decode", 1, 7),
    StepItem("c", "prefill", 3, 5),
    StepItem("p", "prefill", 4, 4),
    StepItem("s", "padding", 2, 9),
    StepItem("p2", "cached", 16, 16),
]
STEP = StepRecord(0, 0.0, 1.0, ITEMS, 3, 0, 4, 8, 0)


def test_grids_follow_the_causal_rule():
    padded, ragged = mask_grids(
        [("d", "decode", 1, 7), ("c", "prefill", 3, 5), ("p", "prefill", 4, 4)]
    )
    assert padded.shape == (3 * 4, 7) and ragged.shape == (1 + 3 + 4, 7)
    assert ragged[0].tolist() == [NEEDED] * 7  # a decode sees its whole context
    assert (
        ragged[1].tolist() == [NEEDED] * 3 + [NOT_COMPUTED] * 4
    )  # chunk token 0 sits at position 2
    assert ragged[3].tolist() == [NEEDED] * 5 + [NOT_COMPUTED] * 2
    assert [int((r == NEEDED).sum()) for r in ragged[4:]] == [
        1,
        2,
        3,
        4,
    ]  # a prompt: the causal triangle
    assert (padded[1:4] == WASTED).all()  # the decode's three padding rows
    assert set(np.unique(padded)) == {NEEDED, WASTED}  # a dense tensor computes every cell


def test_counts_match_the_formula_of_lesson_5():
    shape = [(1, 7), (3, 5), (4, 4)]
    n = mask_counts(STEP)
    assert n["padded"] == len(shape) * max(q for q, _ in shape) * max(c for _, c in shape)
    assert n["needed"] == n["ragged"] == sum(q * c - q * (q - 1) // 2 for q, c in shape)
    assert (n["padded_rows"], n["ragged_rows"]) == (12, 8)


def test_figure_titles_state_the_counts():
    n = mask_counts(STEP)
    titles = " ".join(a.text for a in masks_figure(STEP).layout.annotations)
    assert (
        f"{n['padded']:,} cells computed, {n['padded'] - n['needed']:,} of them masked away"
        in titles
    )
    assert f"ragged: {n['ragged']:,} cells computed" in titles


def test_thin_sequences_share_a_tick():
    vals, text = sequence_ticks(
        [0, 1, 2, 22], [1, 1, 20, 1], ["a x", "b x", "c x", "d x"], min_rows=3
    )
    assert text == ["a…b (2 sequences)", "c x", "d x"] and vals == [0.5, 11.5, 22.0]
