"""One workload under several policies: Gantt charts stacked on one time axis + a metrics table.

The shared x axis is the point: static batching's last bar ends visibly later than
continuous batching's, and each panel marks where its run finished.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm.metrics import metrics_frame, summarize
from minilm.timeline import Timeline

from .gantt import (
    HIGHLIGHT_NAME,
    LEGEND_ON_TOP,
    MS,
    SEGMENT_KINDS,
    aborted_trace,
    check_step,
    failed_note,
    failed_traces,
    gantt_segments,
    highlight_trace,
    request_axis,
    segment_trace,
    token_ticks_trace,
)


def finish_time(tl: Timeline) -> float:
    """The last step's end, or (a client's view, no steps) the last request's."""
    if tl.steps:
        return max(s.t_end for s in tl.steps)
    return max((r.t_finished for r in tl.requests if r.t_finished is not None), default=0.0)


def compare_figure(timelines: dict[str, Timeline], step: dict[str, int] | None = None) -> go.Figure:
    """Gantt charts of named timelines, one row each, sharing the time axis.
    `step` maps a name to a step to highlight in that row."""
    if not timelines:
        raise ValueError("compare_figure needs at least one timeline")
    step = step or {}
    names = list(timelines)
    rows = len(names)
    finish = {n: finish_time(tl) for n, tl in timelines.items()}
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06 / rows,
        subplot_titles=[
            f"{n}: finished at {finish[n] * MS:.1f} ms{failed_note(timelines[n])}" for n in names
        ],
    )
    in_legend: set[str] = set()
    for row, name in enumerate(names, start=1):
        tl = timelines[name]
        check_step(tl, step.get(name))
        seg = gantt_segments(tl)
        for kind in SEGMENT_KINDS:  # each kind in the legend once, from the first row that has it
            first = kind not in in_legend and (seg["kind"] == kind).any()
            in_legend |= {kind} if first else set()
            fig.add_trace(segment_trace(seg, kind, showlegend=bool(first)), row=row, col=1)
        fig.add_trace(highlight_trace(tl, step.get(name), showlegend=row == 1), row=row, col=1)
        if not tl.steps and tl.requests:  # a client's view: a tick per token
            fig.add_trace(
                token_ticks_trace(tl, showlegend="token" not in in_legend), row=row, col=1
            )
            in_legend.add("token")
        if (aborted := aborted_trace(tl, showlegend="aborted" not in in_legend)) is not None:
            fig.add_trace(aborted, row=row, col=1)
            in_legend.add("aborted")
        for trace in failed_traces(tl, in_legend):
            fig.add_trace(trace, row=row, col=1)
            in_legend.add(trace.name)
        fig.update_yaxes(request_axis(tl), title_text=name, row=row, col=1)
        fig.update_yaxes(showticklabels=len(tl.requests) <= 30, row=row, col=1)
        fig.add_vline(
            x=finish[name] * MS, line=dict(color="black", dash="dot", width=1), row=row, col=1
        )
    clock = (
        " (simulated time)"
        if any(t.meta.get("clock") == "simulated" for t in timelines.values())
        else ""
    )
    fig.update_xaxes(title_text=f"time (ms){clock}", row=rows, col=1)
    most = max(len(t.requests) for t in timelines.values())
    fig.update_layout(
        barmode="overlay",
        bargap=0.1,
        height=100 + rows * min(450, max(200, 60 + 10 * most)),
        title=f"one workload, {rows} policies",
        legend=dict(LEGEND_ON_TOP, y=1.02),
        margin=dict(l=70, r=20, t=60, b=40),
    )
    return fig


def set_compare_step(
    fig: go.Figure, timelines: dict[str, Timeline], step: dict[str, int | None]
) -> None:
    """Move the highlighted step of some rows of `compare_figure`, in place (only those traces change)."""
    names = list(timelines)
    with fig.batch_update():
        for name, k in step.items():
            tl = timelines[name]
            check_step(tl, k)
            yaxis = "y" if names.index(name) == 0 else f"y{names.index(name) + 1}"
            trace = next(
                t for t in fig.data if t.name == HIGHLIGHT_NAME and (t.yaxis or "y") == yaxis
            )
            new = highlight_trace(tl, k)
            trace.update(
                base=new.base,
                x=new.x,
                y=new.y,
                customdata=new.customdata,
                hovertemplate=new.hovertemplate,
            )


def metrics_table(timelines: dict[str, Timeline]) -> pd.DataFrame:
    """`summarize` of each timeline, a row per name: the CLI's table (minilm/metrics.py's
    METRIC_COLUMNS), numeric, units in the headers, latencies in ms, already rounded."""
    return metrics_frame(
        {
            name: summarize(tl) | {"max_num_batched_tokens": tl.meta.get("max_num_batched_tokens")}
            for name, tl in timelines.items()
        }
    )


def metrics_table_figure(timelines: dict[str, Timeline]) -> go.Figure:
    """The same table as a Plotly figure (for pages without pandas' HTML)."""
    df = metrics_table(timelines)
    cells = [list(df.index)] + [["-" if pd.isna(v) else v for v in df[c]] for c in df.columns]
    fig = go.Figure(
        go.Table(header=dict(values=[df.index.name, *df.columns]), cells=dict(values=cells))
    )
    fig.update_layout(height=80 + 30 * len(df), margin=dict(l=10, r=10, t=10, b=10))
    return fig
