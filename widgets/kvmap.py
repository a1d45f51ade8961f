"""KV block map: which request owns each cache block, step by step (lesson 4).

A heatmap with a column per step and a row per block id, read from each step's
`StepRecord.kv_blocks` (the block tables after scheduling). A cell is

- a request's colour when that block holds its tokens,
- hatched grey when the request owns the block but no token is in it yet: the
  `reserved` KV mode's waste (a request gets blocks for prompt + max_tokens up front),
  or static batching's reservation for the padded length; in paged mode only the
  last block of a sequence can be partly empty, and it is never wholly empty,
- dark when several requests share the block (prefix caching: one copy of a shared
  prompt prefix in many block tables),
- pale orange when no request holds it but it keeps a cached prefix (prefix caching:
  free, yet a later request with that prefix can reuse it until it is evicted),
- empty (white) when the block is free.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from minilm.core.kv_cache import cdiv
from minilm.timeline import Timeline

from .gantt import check_step, request_order

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
)
RESERVED_COLOR = "#bdbdbd"
SHARED_COLOR = "#252525"
CACHED_COLOR = "#fdd0a2"


def kv_cells(tl: Timeline, max_steps: int = 600, max_cells: int = 300_000):
    """(steps shown, owner [blocks x steps] request index or -1, reserved [blocks x steps] bool,
    holders [blocks x steps] how many tables hold the block, cached [blocks x steps] bool).

    Rows are the blocks 0..highest block id ever handed out: the allocator hands out low ids
    first, so on a big simulated GPU (tens of thousands of blocks) the never-used rest is
    left out. Long runs show every k-th step, so the map stays small (at most `max_steps`
    columns and about `max_cells` cells)."""
    if any(s.kv_blocks is None for s in tl.steps):
        raise ValueError(
            "this timeline has no block tables: run the engine with record_kv_blocks=True"
        )
    order = {rid: i for i, rid in enumerate(request_order(tl))}
    rows = 1 + max((max(t) for s in tl.steps for t in s.kv_blocks.values() if t), default=-1)
    rows = max(
        rows, 1 + max((max(s.kv_cached_free) for s in tl.steps if s.kv_cached_free), default=-1)
    )
    block_size = tl.meta.get("block_size", 16)
    stride = max(
        1, math.ceil(len(tl.steps) / max_steps), math.ceil(len(tl.steps) * rows / max_cells)
    )
    stored = stored_tokens(tl)
    shown = list(range(0, len(tl.steps), stride))
    owner = np.full((rows, len(shown)), -1, dtype=int)
    reserved = np.zeros((rows, len(shown)), dtype=bool)
    holders = np.zeros((rows, len(shown)), dtype=int)
    cached = np.zeros((rows, len(shown)), dtype=bool)
    for col, k in enumerate(shown):
        for rid, table in tl.steps[k].kv_blocks.items():
            filled = cdiv(stored[k].get(rid, 0), block_size)
            for j, block in enumerate(table):
                owner[block, col] = order[rid]
                reserved[block, col] = j >= filled
                holders[block, col] += 1
        cached[tl.steps[k].kv_cached_free or [], col] = True
    return shown, owner, reserved, holders, cached


def stored_tokens(tl: Timeline) -> list[dict[str, int]]:
    """Per step, the tokens each request has in its KV blocks after the step's work."""
    now: dict[str, int] = {}
    out = []
    for s in tl.steps:
        for it in s.items:  # context_len counts the slots written so far, padding included
            now[it.request_id] = it.context_len
        out.append({rid: now.get(rid, 0) for rid in (s.kv_blocks or {})})
    return out


def kvmap_figure(
    tl: Timeline, step: int | None = None, title: str | None = None, max_steps: int = 600
) -> go.Figure:
    check_step(tl, step)
    shown, owner, reserved, holders, cached = kv_cells(tl, max_steps)
    ids = np.array(request_order(tl) + [""], dtype=object)  # index -1 -> ""
    n = len(PALETTE)
    shared = holders > 1
    # empty cells are None, not NaN: a FigureWidget sends its data as strict JSON, which has no NaN
    used = np.where(
        (owner >= 0) & ~reserved & ~shared, owner % n + 0.5, None
    )  # + 0.5: the middle of a band
    state = np.where(
        owner < 0,
        np.where(cached, "free, keeps a cached prefix", "free"),
        np.where(
            shared,
            "and " + (holders - 1).astype(str) + " more share it",
            np.where(reserved, "reserved, no token yet", "holds tokens"),
        ),
    )
    custom = np.dstack([ids[owner], state])
    scale = [
        [(i + j) / n, c] for i, c in enumerate(PALETTE) for j in (0, 1)
    ]  # one flat band per colour
    hover = "step %{x} · block %{y}<br>%{customdata[0]} %{customdata[1]}<extra></extra>"

    def flat(mask, color, name):
        return go.Heatmap(
            x=shown,
            z=np.where(mask, 1.0, None),
            customdata=custom,
            zmin=0,
            zmax=1,
            colorscale=[[0, color], [1, color]],
            showscale=False,
            name=name,
            hovertemplate=hover,
            hoverongaps=False,
        )

    fig = go.Figure(
        [
            go.Heatmap(
                x=shown,
                z=used,
                customdata=custom,
                zmin=0,
                zmax=n,
                colorscale=scale,
                showscale=False,
                name="owner",
                hovertemplate=hover,
                hoverongaps=False,
            ),
            flat(reserved & ~shared, RESERVED_COLOR, "reserved, unused"),
            flat(shared, SHARED_COLOR, "shared"),
            flat(cached & (owner < 0), CACHED_COLOR, "cached, free"),
        ]
    )
    mode = tl.meta.get("kv_mode", "paged")
    total = max((s.kv_blocks_total for s in tl.steps), default=0)
    unused = f"; blocks {owner.shape[0]}–{total - 1} never used" if owner.shape[0] < total else ""
    caching = (
        "; dark = shared, orange = cached but free" if tl.meta.get("enable_prefix_caching") else ""
    )
    fig.update_layout(
        title=title
        or f"{tl.meta.get('policy', '?')}: KV blocks over steps ({mode} mode; "
        f"grey = owned but empty{caching}{unused})",
        xaxis=dict(title="step"),
        yaxis=dict(title="block id", autorange="reversed"),
        plot_bgcolor="white",
        height=min(700, max(300, 100 + 6 * owner.shape[0])),
        shapes=kv_step_marker(step),
        margin=dict(l=60, r=20, t=50, b=40),
    )
    return fig


def kv_step_marker(step: int | None) -> list[dict]:
    if step is None:
        return []
    return [
        dict(
            type="rect",
            xref="x",
            yref="paper",
            x0=step - 0.5,
            x1=step + 0.5,
            y0=0,
            y1=1,
            fillcolor="rgba(0,0,0,0)",
            line=dict(color="black", width=2),
        )
    ]
