"""Step view: what each engine step computed, how long it took, and what it held.

Rows (shared step axis):
1. tokens by kind (prefill / decode / padding) stacked, against the token budget
   (`max_num_batched_tokens`): how full each step is, and how much of it is padding;
   with speculative decoding (lesson 10) a decode's drafts are stacked apart, accepted
   and rejected, over the one token each decode samples after its last known one
2. step duration (ms): a long prompt in one step shows as a spike (lesson 6); the model's
   share of it, and with speculation that share split into verify (the target's forward
   over the drafts, and sampling) and draft (proposing the next step's drafts)
3. effective batch size (requests with real work) and the queue length
4. KV blocks in use against the cache size
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm.metrics import DRAFT_KINDS, steps_df
from minilm.timeline import Timeline

from .gantt import KIND_COLORS, KIND_LABELS, MS, check_step

STEP_ROWS = ("tokens", "step time (ms)", "batch size", "KV blocks")

# a step's tokens, stacked: a decode's drafts apart from the token it samples after its last known one
COMPOSITION = ("prefill", "decode", *DRAFT_KINDS, "padding")


def token_column(df, kind: str):
    """The tokens of one COMPOSITION kind in each step (steps_df's columns; decode without its drafts)."""
    return df["decode_tokens"] - df["draft_tokens"] if kind == "decode" else df[f"{kind}_tokens"]


def steps_figure(tl: Timeline, step: int | None = None, title: str | None = None) -> go.Figure:
    check_step(tl, step)
    df = steps_df(tl)
    x = df["step"] if len(df) else []
    fig = make_subplots(
        rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04, subplot_titles=STEP_ROWS
    )
    speculated = bool(len(df)) and bool(df["draft_tokens"].any())
    for kind in COMPOSITION:
        col = token_column(df, kind) if len(df) else []
        name = KIND_LABELS.get(kind, kind)
        fig.add_trace(
            go.Bar(
                x=x,
                y=col,
                name=f"{name} tokens",
                showlegend=kind not in DRAFT_KINDS or speculated,
                marker=dict(color=KIND_COLORS[kind], line=dict(width=0)),
                hovertemplate="step %{x}: %{y} " + name + " tokens<extra></extra>",
            ),
            row=1,
            col=1,
        )
    # a policy without a per-step token budget (static: its batch is as wide as its padded prompts) has no line
    limit = tl.meta.get("max_num_batched_tokens")
    budget = [] if limit is None else [limit] * len(x)
    fig.add_trace(
        go.Scatter(
            x=x if budget else [],
            y=budget,
            name="token budget",
            mode="lines",
            line=dict(color="black", dash="dash"),
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=df["duration"] * MS if len(df) else [],
            name="step time",
            mode="lines",
            line=dict(color="#9467bd"),
            hovertemplate="step %{x}: %{y:.2f} ms<extra></extra>",
        ),
        row=2,
        col=1,
    )
    # the model's (and sampler's) share; the gap above it is the engine's own work: scheduling, updating
    fig.add_trace(
        go.Scatter(
            x=x,
            y=df["model_time"] * MS if len(df) else [],
            name="of which the model",
            mode="lines",
            line=dict(color="#9467bd", dash="dot"),
            hovertemplate="step %{x}: model %{y:.2f} ms<extra></extra>",
        ),
        row=2,
        col=1,
    )
    # speculative decoding: the model's share is the target verifying the drafts, then drafting the next ones
    for name, column, color in (
        ("verify", "verify_time", "#17becf"),
        ("draft", "draft_time", "#e377c2"),
    ):
        fig.add_trace(
            go.Scatter(
                x=x if speculated else [],
                y=df[column] * MS if speculated else [],
                name=f"of which {name}",
                mode="lines",
                line=dict(color=color, dash="dash"),
                showlegend=speculated,
                hovertemplate="step %{x}: " + name + " %{y:.2f} ms<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=df["batch_size"] if len(df) else [],
            name="batch size",
            mode="lines",
            line=dict(color="#2ca02c", shape="hv"),
        ),
        row=3,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=df["num_waiting"] if len(df) else [],
            name="waiting",
            mode="lines",
            line=dict(color="#d9a000", shape="hv"),
        ),
        row=3,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=df["kv_blocks_used"] if len(df) else [],
            name="KV blocks used",
            mode="lines",
            line=dict(color="#1f77b4", shape="hv"),
        ),
        row=4,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=df["kv_blocks_total"] if len(df) else [],
            name="KV blocks total",
            mode="lines",
            line=dict(color="black", dash="dot"),
        ),
        row=4,
        col=1,
    )
    clock = " (simulated time)" if tl.meta.get("clock") == "simulated" else ""
    fig.update_layout(
        barmode="stack",
        bargap=0,
        height=700,
        shapes=step_marker(step),
        title=title or f"{tl.meta.get('policy', '?')}: per-step view{clock}",
        margin=dict(l=60, r=20, t=60, b=40),
    )
    fig.update_xaxes(title_text="step", row=4, col=1)
    return fig


def step_marker(step: int | None) -> list[dict]:
    """A vertical band over one step, through every row."""
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
            fillcolor="rgba(255,215,0,0.35)",
            line=dict(width=0),
            layer="below",
        )
    ]
