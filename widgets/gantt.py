"""Request Gantt chart: one row per request, time (ms) on x, one bar per thing it did.

Segments of a request's life, all read from the timeline:

queued     arrival -> first admitted (waiting in the queue)
prefill    one bar per prompt chunk (one step each)
decode     one bar per contiguous stretch of decode steps (aggregated: a request that
           decodes for 500 steps is one bar, not 500, so 1,000 requests stay readable)
preempted  evicted (recompute-style) -> re-admitted: its KV blocks were taken away
recompute  the prefill steps that rebuild a preempted request's KV
padding    static batching's dead work: pad tokens of a shorter prompt, and a finished
           row that keeps computing until the longest row of its batch ends
cached     prompt tokens found in the prefix cache when admitted: no compute, drawn as a
           stripe over the step that admitted the request (lesson 8)
accepted   speculative decoding (lesson 10): of a decode bar's draft tokens, those the target
rejected   kept and those it threw away, drawn as one stripe over the bar split across its
           thickness in their proportion (a bar of 1,000 steps stays one bar; the per-step
           split is in the step view); the hover says "40 drafts, 30 accepted"
aborted    a cross where a request stopped because its client went away (lesson 9)
waiting    a client's view (a timeline with requests and no engine steps, e.g. from a
           `vllm bench serve` result file, lesson 9): sent -> first token; then one decode
           bar to the last token, with a tick per token
failed     a client's view: a dark red cross where a request that got no token was sent, and
incomplete an open red cross where one that broke off got its last token; the hover names the error

Plotly's `px.timeline` only takes datetimes, so the chart is horizontal bars on a
numeric axis: `go.Bar(base=start, x=duration, orientation="h")` (`x` is the length).
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from minilm.metrics import DRAFT_KINDS
from minilm.timeline import ERROR, INCOMPLETE, Timeline

SEGMENT_KINDS = (
    "queued",
    "prefill",
    "recompute",
    "decode",
    "transfer",  # a disaggregated pair's KV crossing between its engine cores (serve/kv_transfer.py)
    "preempted",
    "padding",
    "cached",
    *DRAFT_KINDS,
    "waiting",
)
KIND_COLORS = {
    "queued": "#d9d9d9",
    "prefill": "#1f77b4",
    "recompute": "#ff7f0e",
    "decode": "#2ca02c",
    "preempted": "#f4a3a3",
    "padding": "#7f7f7f",
    "cached": "#fd8d3c",
    "waiting": "#c5b0d5",
    "accepted": "#98df8a",
    "rejected": "#d62728",
    "transfer": "#9467bd",  # a prompt's KV crossing the link to a decode replica (widgets/fleet.py)
}  # drafts: a kept one is a decode token (green)
KIND_LABELS = {
    "accepted": "draft accepted",
    "rejected": "draft rejected",
}  # legend names; a kind's own otherwise
STRIPES = ("padding", "cached", *DRAFT_KINDS)  # drawn thin over their row's work in the same step
STRIPE_WIDTH = 0.45
SEGMENT_COLUMNS = [
    "request_id",
    "kind",
    "start",
    "end",
    "first_step",
    "last_step",
    "tokens",
    "context_len",
    "drafts",
    "accepted",
]
HIGHLIGHT_NAME = "selected step"
LEGEND_ON_TOP = dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom")
MS = 1000.0


def natural_key(request_id: str) -> list:
    """'r2' before 'r10'."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", request_id)]


def request_order(tl: Timeline) -> list[str]:
    """Rows top to bottom: by arrival, then by id."""
    return [
        r.request_id
        for r in sorted(tl.requests, key=lambda r: (r.arrival, natural_key(r.request_id)))
    ]


def row_labels(ids: list[str]) -> list[str]:
    """Short row labels: a prefix that every id shares up to a '-' or '_' is left out, so a
    benchmark client's `bench-3f9c2a1e-17` reads `17` (the hover text keeps the whole id)."""
    if len(ids) < 2:
        return list(ids)
    common = ids[0][: min(len(i) for i in ids)]
    for i in ids[1:]:
        while not i.startswith(common):
            common = common[:-1]
    cut = max(common.rfind("-"), common.rfind("_")) + 1
    return [i[cut:] or i for i in ids]


def request_axis(tl: Timeline) -> dict:
    """A Gantt's y axis: a row per request, the first to arrive on top, short labels (no tick
    labels past 60 rows)."""
    order = request_order(tl)
    return dict(
        categoryorder="array",
        categoryarray=order,
        autorange="reversed",
        tickvals=order,
        ticktext=row_labels(order),
        showticklabels=len(order) <= 60,
    )


def gantt_segments(tl: Timeline) -> pd.DataFrame:
    """Every bar of the Gantt chart as a row (times in seconds, like the timeline).

    One pass over the steps. A segment is a list in SEGMENT_COLUMNS order (lists, not
    dicts: a 1,000-request run has ~500k step items and this loop is the figure's cost).
    A decode stretch counts the drafts it verified and accepted; `draft_segments` adds them."""
    if not tl.steps and tl.requests:
        return client_segments(tl)
    rows: list[list] = []
    runs: dict[str, dict[str, list]] = {
        "decode": {},
        "padding": {},
        "transfer": {},
    }  # open stretches
    last_end: dict[str, float] = {}  # t_end of each request's latest item
    last_ctx: dict[str, int] = {}  # and the context it reached
    recomputing: set[str] = set()
    for s in tl.steps:
        k, t0, t1 = s.step, s.t_start, s.t_end
        for it in s.items:
            rid, kind = it.request_id, it.kind
            if kind in ("prefill", "cached"):
                first_pos = 0 if kind == "cached" else it.context_len - it.num_tokens
                if (
                    rid in last_ctx and first_pos < last_ctx[rid]
                ):  # preempted, now rebuilt from the start
                    recomputing.add(rid)
                    rows.append([rid, "preempted", last_end[rid], t0, k, k - 1, 0, 0, 0, 0])
                shown = (
                    kind if kind == "cached" else "recompute" if rid in recomputing else "prefill"
                )
                rows.append([rid, shown, t0, t1, k, k, it.num_tokens, it.context_len, 0, 0])
            else:
                if recomputing and kind == "decode":
                    recomputing.discard(rid)
                run = runs[kind].get(rid)
                if run is not None and run[5] == k - 1:  # the stretch goes on: extend its bar
                    run[3], run[5], run[6], run[7] = t1, k, run[6] + it.num_tokens, it.context_len
                    if it.num_draft:
                        run[8], run[9] = run[8] + it.num_draft, run[9] + it.num_accepted
                else:
                    run = runs[kind][rid] = [
                        rid,
                        kind,
                        t0,
                        t1,
                        k,
                        k,
                        it.num_tokens,
                        it.context_len,
                        it.num_draft,
                        it.num_accepted,
                    ]
                    rows.append(run)
            last_end[rid], last_ctx[rid] = t1, it.context_len
    starts = [s.t_start for s in tl.steps]
    for r in tl.requests:
        if r.t_scheduled is not None and r.t_scheduled > r.arrival:
            first = tl.steps[
                min(bisect_left(starts, r.t_scheduled), len(starts) - 1)
            ].step  # admitted here
            rows.append(
                [r.request_id, "queued", r.arrival, r.t_scheduled, first, first, 0, 0, 0, 0]
            )
    return draft_segments(pd.DataFrame(rows, columns=SEGMENT_COLUMNS))


def draft_segments(seg: pd.DataFrame) -> pd.DataFrame:
    """`seg` and, over each decode stretch that verified drafts, an `accepted` and a `rejected`
    segment (tokens: how many of its drafts); none where there were none of that kind."""
    spec = seg[(seg["kind"] == "decode") & (seg["drafts"] > 0)]
    if spec.empty:
        return seg
    parts = [
        spec.assign(kind="accepted", tokens=spec["accepted"]),
        spec.assign(kind="rejected", tokens=spec["drafts"] - spec["accepted"]),
    ]
    return pd.concat([seg, *(p[p["tokens"] > 0] for p in parts)], ignore_index=True)


def client_segments(tl: Timeline) -> pd.DataFrame:
    """A timeline without engine steps (what a client saw): waiting from sent to the first token,
    then decoding to the last token. Steps are unknown (NaN). A request that failed before any
    token has no bar: how long it waited is not known (`failed_traces` marks it)."""
    nan, rows = float("nan"), []
    for r in tl.requests:
        if r.finish_reason == ERROR:
            continue
        first = r.t_first_token
        rows.append(
            [
                r.request_id,
                "waiting",
                r.arrival,
                first if first is not None else (r.t_finished or r.arrival),
                nan,
                nan,
                r.prompt_len,
                r.prompt_len,
                0,
                0,
            ]
        )
        if first is not None and r.token_times:
            rows.append(
                [
                    r.request_id,
                    "decode",
                    first,
                    r.token_times[-1],
                    nan,
                    nan,
                    r.output_len,
                    r.prompt_len + r.output_len,
                    0,
                    0,
                ]
            )
    return pd.DataFrame(rows, columns=SEGMENT_COLUMNS)


def token_ticks_trace(tl: Timeline, showlegend: bool = True) -> go.Scatter:
    """A tick at every token a client received (timelines without engine steps)."""
    x = [t * MS for r in tl.requests for t in r.token_times]
    y = [r.request_id for r in tl.requests for _ in r.token_times]
    return go.Scatter(
        name="token",
        legendgroup="token",
        showlegend=showlegend,
        x=x,
        y=y,
        mode="markers",
        marker=dict(symbol="line-ns-open", size=8, color="#0b4d0b"),
        hovertemplate="%{y}: a token at %{x:.1f} ms<extra></extra>",
    )


def aborted_trace(tl: Timeline, showlegend: bool = True) -> go.Scatter | None:
    """A cross where each aborted request stopped (its client went away, lesson 9); None if none was."""
    aborted = [r for r in tl.requests if r.finish_reason == "aborted" and r.t_finished is not None]
    if not aborted:
        return None
    return go.Scatter(
        name="aborted",
        legendgroup="aborted",
        showlegend=showlegend,
        mode="markers",
        x=[r.t_finished * MS for r in aborted],
        y=[r.request_id for r in aborted],
        marker=dict(symbol="x", size=10, color="#d62728"),
        hovertemplate="%{y}: aborted at %{x:.1f} ms (its client went away)<extra></extra>",
    )


# a failed request of a client's run (minilm/timeline.py): its legend name and marker
FAILURE_MARKS = {
    ERROR: ("failed", dict(symbol="x", size=11, color="#8b0000")),
    INCOMPLETE: ("incomplete", dict(symbol="x-open", size=11, color="#d62728")),
}


def error_line(error: str, limit: int = 160) -> str:
    """An error for a hover: a traceback's last line (the exception), shortened, made safe for HTML."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    text = lines[-1] if lines else "no message"
    return html.escape(
        text if len(text) <= limit else text[: limit - 1] + "…", quote=False
    )  # plotly reads &lt; not &quot;


def failed_traces(tl: Timeline, in_legend: set[str] = frozenset()) -> list[go.Scatter]:
    """A cross per failed request, one trace per kind of failure that `tl` has (none when nothing
    failed): where it was sent when no token came, at its last token when it broke off. A name in
    `in_legend` is in the figure's legend already."""
    traces = []
    for reason, (name, marker) in FAILURE_MARKS.items():
        rows = [r for r in tl.requests if r.finish_reason == reason]
        if not rows:
            continue
        what = (
            "sent at %{x:.1f} ms, no token came"
            if reason == ERROR
            else "stopped at %{x:.1f} ms after %{customdata[1]} tokens"
        )
        traces.append(
            go.Scatter(
                name=name,
                legendgroup=name,
                showlegend=name not in in_legend,
                mode="markers",
                marker=marker,
                x=[r.t_finished * MS for r in rows],
                y=[r.request_id for r in rows],
                customdata=[[error_line(r.error), r.output_len] for r in rows],
                hovertemplate="%{y}: " + name + ", " + what + "<br>%{customdata[0]}<extra></extra>",
            )
        )
    return traces


def failed_note(tl: Timeline) -> str:
    """ ", 2 of 40 failed" for a client's run with failed requests; "" otherwise."""
    failed = sum(r.failed for r in tl.requests)
    return f", {failed} of {len(tl.requests)} failed" if failed else ""


def segment_trace(seg: pd.DataFrame, kind: str, showlegend: bool = True) -> go.Bar:
    """One horizontal bar trace for all segments of one kind."""
    part = seg[seg["kind"] == kind]
    start_ms = part["start"].to_numpy(float) * MS
    dur_ms = (part["end"].to_numpy(float) - part["start"].to_numpy(float)) * MS
    drafts = kind in DRAFT_KINDS or (kind == "decode" and bool(part["drafts"].any()))
    # numbers only: plotly copies customdata, and copying a float array is a memcpy (1,000
    # requests: an object array of strings made the figure 3x slower to build)
    columns = ["first_step", "last_step", "tokens", "context_len"] + (
        ["drafts", "accepted"] if drafts else []
    )
    custom = (
        np.column_stack([part[c].to_numpy(float) for c in columns] + [start_ms + dur_ms])
        if len(part)
        else np.empty((0, len(columns) + 1))
    )
    end = len(columns)  # customdata's last column: the end in ms
    if kind in DRAFT_KINDS:
        what = f"<br>%{{customdata[2]}} of %{{customdata[4]}} drafts {kind}"
    else:
        what = "<br>tokens %{customdata[2]}<br>context len %{customdata[3]}" + (
            "<br>%{customdata[4]} drafts, %{customdata[5]} accepted" if drafts else ""
        )
    return go.Bar(
        name=KIND_LABELS.get(kind, kind),
        legendgroup=kind,
        showlegend=showlegend,
        orientation="h",
        base=start_ms,
        x=dur_ms,
        y=part["request_id"].to_numpy(object),
        customdata=custom,
        # padding, cached and draft tokens overlap their row's work in the same steps: thinner stripes on top
        **stripe_geometry(part, kind),
        marker=dict(
            color=KIND_COLORS[kind],
            line=dict(width=0),
            pattern=dict(shape="/") if kind in ("padding", "preempted") else None,
        ),
        hovertemplate=(
            "%{y} · "
            + KIND_LABELS.get(kind, kind)
            + (
                ""
                if len(part) and part["first_step"].isna().all()
                else "<br>steps %{customdata[0]}–%{customdata[1]}"
            )
            + what
            + f"<br>%{{base:.2f}} – %{{customdata[{end}]:.2f}} ms<extra></extra>"
        ),
    )


def stripe_geometry(part: pd.DataFrame, kind: str) -> dict:
    """Bar thickness (and offset): a draft stripe shares one stripe's thickness between its accepted
    and its rejected drafts, in their proportion (accepted on one side, rejected on the other)."""
    if kind not in DRAFT_KINDS:
        return {"width": STRIPE_WIDTH if kind in STRIPES else 0.8}
    share = (
        part["tokens"].to_numpy(float) / part["drafts"].to_numpy(float) * STRIPE_WIDTH
    )  # this kind's part
    before = 0.0 if kind == "accepted" else STRIPE_WIDTH - share  # the accepted part comes first
    return {"width": share, "offset": -STRIPE_WIDTH / 2 + before}


def highlight_trace(tl: Timeline, step: int | None, showlegend: bool = True) -> go.Bar:
    """Outlined bars over the rows that are in step `step`'s batch (empty when None)."""
    items = tl.steps[step].items if step is not None else []
    s = tl.steps[step] if step is not None else None
    ids = [it.request_id for it in items]
    return go.Bar(
        name=HIGHLIGHT_NAME,
        legendgroup=HIGHLIGHT_NAME,
        showlegend=showlegend,
        orientation="h",
        base=[s.t_start * MS] * len(ids) if s else [],
        x=[s.duration * MS] * len(ids) if s else [],
        y=ids,
        width=0.95,
        customdata=[[it.kind, it.num_tokens] for it in items],
        marker=dict(color="rgba(0,0,0,0)", line=dict(color="black", width=2)),
        hovertemplate="%{y} in step "
        + (str(step) if s else "")
        + ": %{customdata[0]}, %{customdata[1]} tokens<extra></extra>",
    )


def step_band(tl: Timeline, step: int | None, xref: str = "x", yref: str = "paper") -> list[dict]:
    """A translucent vertical band over step `step` (a layout shape)."""
    if step is None:
        return []
    s = tl.steps[step]
    return [
        dict(
            type="rect",
            xref=xref,
            yref=yref,
            x0=s.t_start * MS,
            x1=s.t_end * MS,
            y0=0,
            y1=1,
            fillcolor="rgba(255,215,0,0.35)",
            line=dict(width=0),
            layer="below",
        )
    ]


def check_step(tl: Timeline, step: int | None) -> None:
    if step is not None and not 0 <= step < len(tl.steps):
        raise ValueError(
            f"step={step}; allowed: 0..{len(tl.steps) - 1} (the timeline has {len(tl.steps)} steps)"
        )


def gantt_axes(tl: Timeline) -> tuple[dict, dict]:
    """(xaxis, yaxis) layout: numeric ms axis; the request axis of `request_axis`."""
    return dict(title="time (ms)", type="linear"), dict(request_axis(tl), title="request")


def gantt_figure(tl: Timeline, step: int | None = None, title: str | None = None) -> go.Figure:
    """The request Gantt chart of one timeline; `step` highlights that step's batch."""
    check_step(tl, step)
    seg = gantt_segments(tl)
    # a kind in the legend only when the run has it (as compare_figure): drafts only where it speculated
    present = set(seg["kind"])
    fig = go.Figure(
        [segment_trace(seg, k, showlegend=k in present) for k in SEGMENT_KINDS]
        + [highlight_trace(tl, step)]
    )
    if not tl.steps and tl.requests:  # a client's view: no steps, a tick per token instead
        fig.add_trace(token_ticks_trace(tl))
    if (aborted := aborted_trace(tl)) is not None:
        fig.add_trace(aborted)
    fig.add_traces(failed_traces(tl))
    xaxis, yaxis = gantt_axes(tl)
    fig.update_layout(
        barmode="overlay",
        xaxis=xaxis,
        yaxis=yaxis,
        shapes=step_band(tl, step),
        title=title or gantt_title(tl),
        height=gantt_height(len(tl.requests)),
        bargap=0.1,
        margin=dict(l=60, r=20, t=70, b=40),
        legend=LEGEND_ON_TOP,
    )
    return fig


def gantt_title(tl: Timeline) -> str:
    m = tl.meta
    if not tl.steps and tl.requests:
        return f"{m.get('policy', '?')} · {len(tl.requests)} requests{failed_note(tl)} · client side: sent -> tokens"
    clock = " (simulated)" if m.get("clock") == "simulated" else ""
    return f"{m.get('policy', '?')} · {len(tl.requests)} requests · {len(tl.steps)} steps{clock}"


def gantt_height(num_requests: int) -> int:
    """Pixels: ~14 per row for small runs, capped so 1,000 rows stay one screen or two."""
    return int(min(900, max(300, 120 + 14 * num_requests)))


def set_gantt_step(fig: go.Figure, tl: Timeline, step: int | None) -> None:
    """Move the highlight of `gantt_figure` to `step`, in place."""
    check_step(tl, step)
    new = highlight_trace(tl, step)
    trace = next(t for t in fig.data if t.name == HIGHLIGHT_NAME)
    with fig.batch_update():
        trace.update(
            base=new.base,
            x=new.x,
            y=new.y,
            customdata=new.customdata,
            hovertemplate=new.hovertemplate,
        )
        fig.layout.shapes = step_band(tl, step)
