"""Attention over one mixed step, two ways: padded + masked vs ragged (lesson 5).

A step's sequences each bring `q` new query tokens and attend to `c` keys (their context
after the step: cached + new). New token j of a sequence sits at position c - q + j and
sees the keys before it and itself (causal): keys 0 .. c - q + j.

padded + masked   one dense [B, max_q, max_c] score tensor: every sequence padded to the
                  most new tokens and the longest context of the step; cells that are
                  padding or in a token's future are computed, then masked away
ragged            only the real query tokens (`cu_seqlens_q` says whose they are), each
                  against its own sequence's keys: no padding row, no padding key

The cells of each layout, counted per attention head and layer: `needed` are the
(query, key) pairs attention really uses, the same in both layouts. (A tiled kernel such
as minilm's Triton one computes whole tiles, so it also touches the masked corners of
the tiles at each sequence's edge: a few more than `needed`, never a padding row.)
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm.timeline import StepRecord

NEEDED, WASTED, NOT_COMPUTED = 2, 1, 0
COLORS = {NOT_COMPUTED: "#ffffff", WASTED: "#f4a582", NEEDED: "#2166ac"}


def step_shape(step: StepRecord) -> list[tuple[str, str, int, int]]:
    """(request id, kind, new tokens q, context c) of each sequence that computes in the step."""
    return [
        (i.request_id, i.kind, i.num_tokens, i.context_len)
        for i in step.items
        if i.kind in ("prefill", "decode")
    ]


def mask_grids(shape: list[tuple[str, str, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(padded [B * max_q, max_c], ragged [T, max_c]) grids of NEEDED / WASTED / NOT_COMPUTED cells."""
    max_q = max(q for _, _, q, _ in shape)
    max_c = max(c for _, _, _, c in shape)
    keys = np.arange(max_c)[None, :]
    padded, ragged = [], []
    for _, _, q, c in shape:
        rows = np.arange(max_q)[:, None]
        sees = (rows < q) & (keys <= c - q + rows)  # a real new token and a key it may see
        padded.append(np.where(sees, NEEDED, WASTED))
        ragged.append(np.where(sees[:q], NEEDED, NOT_COMPUTED))
    return np.vstack(padded), np.vstack(ragged)


def mask_counts(step: StepRecord) -> dict[str, int]:
    """Cells per head and layer: computed by each layout, and needed."""
    padded, ragged = mask_grids(step_shape(step))
    return {
        "padded": padded.size,
        "ragged": int((ragged == NEEDED).sum()),
        "needed": int((padded == NEEDED).sum()),
        "padded_rows": padded.shape[0],
        "ragged_rows": ragged.shape[0],
    }


def masks_figure(step: StepRecord, title: str | None = None) -> go.Figure:
    """The step's attention as two heatmaps on one scale: each cell a (query token, key) pair."""
    shape = step_shape(step)
    padded, ragged = mask_grids(shape)
    n = mask_counts(step)
    max_q = padded.shape[0] // len(shape)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        row_heights=[padded.shape[0], ragged.shape[0]],
        subplot_titles=[
            f"padded + masked: {n['padded']:,} cells computed, {n['padded'] - n['needed']:,} of them "
            f"masked away ({1 - n['needed'] / n['padded']:.0%} wasted)",
            f"ragged: {n['ragged']:,} cells computed, all of them needed",
        ],
    )
    scale = [
        [0, COLORS[NOT_COMPUTED]],
        [0.34, COLORS[NOT_COMPUTED]],
        [0.34, COLORS[WASTED]],
        [0.67, COLORS[WASTED]],
        [0.67, COLORS[NEEDED]],
        [1, COLORS[NEEDED]],
    ]
    hover = "query row %{y} · key %{x}<br>%{customdata}<extra></extra>"
    words = np.array(["not computed", "computed, masked away", "needed"], dtype=object)
    starts = {
        "padded": [k * max_q for k in range(len(shape))],
        "ragged": list(np.cumsum([0] + [q for _, _, q, _ in shape])[:-1]),
    }
    for row, (name, grid) in enumerate((("padded", padded), ("ragged", ragged)), start=1):
        fig.add_trace(
            go.Heatmap(
                z=grid,
                zmin=0,
                zmax=2,
                colorscale=scale,
                showscale=False,
                customdata=words[grid],
                hovertemplate=hover,
                name=name,
            ),
            row=row,
            col=1,
        )
        lengths = [max_q] * len(shape) if name == "padded" else [q for _, _, q, _ in shape]
        for s in starts[name][1:]:  # a line between two sequences
            fig.add_hline(y=s - 0.5, line=dict(color="#555555", width=0.8), row=row, col=1)
        vals, text = sequence_ticks(
            starts[name],
            lengths,
            [f"{rid} {kind[:3]} {q}×{c}" for rid, kind, q, c in shape],
            min_rows=grid.shape[0] / 25,
        )
        fig.update_yaxes(
            autorange="reversed", tickmode="array", tickvals=vals, ticktext=text, row=row, col=1
        )
    fig.update_xaxes(title_text="key position (context)", row=2, col=1)
    fig.update_layout(
        height=min(900, 220 + 2 * (padded.shape[0] + ragged.shape[0])),
        plot_bgcolor="white",
        margin=dict(l=130, r=20, t=80, b=50),
        title=title
        or "attention of one mixed step, per head and layer: blue = needed, "
        "orange = computed then masked, white = not computed",
    )
    return fig


def sequence_ticks(starts: list[int], lengths: list[int], labels: list[str], min_rows: float):
    """One y tick per sequence, in the middle of its rows; runs of sequences too thin to
    label on their own (decodes: one row each) share one tick, "r0…r3"."""
    vals, text, run = [], [], []

    def flush():
        if run:
            first, last = run[0], run[-1]
            vals.append((starts[first] + starts[last] + lengths[last] - 1) / 2)
            text.append(
                labels[first]
                if first == last
                else f"{labels[first].split()[0]}…{labels[last].split()[0]} ({last - first + 1} sequences)"
            )
            run.clear()

    for k, (start, rows) in enumerate(zip(starts, lengths)):
        if rows >= min_rows:
            flush()
            vals.append(start + (rows - 1) / 2)
            text.append(labels[k])
        else:
            run.append(k)
    flush()
    return vals, text
