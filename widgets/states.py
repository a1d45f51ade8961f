"""The request state machine, drawn from a run: how often each transition happened (lesson 3).

Source 000 draws a request's life as waiting -> prefill (a chunk that is not the last
goes back to prefill) -> decode (one token per step, again and again) -> completed.
The engine's states (minilm/request.py) are pending, waiting, running and finished;
"prefill" and "decode" are not states there but what a running request has left to
compute (its whole prompt, a chunk of it, or one token), as in vLLM V1. Every
transition is read off the timeline, one per step item of a request:

arrive          -> waiting    the request arrived
waiting         -> prefill    admitted: its first step (a whole prompt or a first chunk);
                              after a preemption, the step that starts recomputing it
prefill         -> prefill    the next chunk of the same prompt
prefill         -> decode     the prompt is done (its last chunk sampled the first token)
decode          -> decode     one more token
prefill/decode  -> waiting    preempted: its KV blocks were taken, it queues again
prefill/decode  -> finished   EOS, a stop token, max_tokens, or aborted

A preemption shows on the timeline as a prefill that starts again below where the
request had got to (recompute from position 0, or from its cached prefix); padding
and cached-prefix items are not steps of the state machine and are skipped.
"""

from __future__ import annotations

from collections import Counter

import plotly.graph_objects as go

from minilm.timeline import ERROR, INCOMPLETE, Timeline

STATES = ("waiting", "prefill", "decode", "finished")
REASONS = {
    "stop": "EOS / stop",
    "length": "max_tokens",
    "aborted": "aborted",
    ERROR: "failed (no token)",
    INCOMPLETE: "broke off (incomplete)",
}  # a client's run (lesson 9)


def transition_counts(tl: Timeline) -> Counter:
    """{(from, to): how many times} over the whole run; `from` is "arrive" for arrivals."""
    counts: Counter = Counter()
    last: dict[str, tuple[str, int]] = {}  # request -> (kind, context_len) of its latest item
    for s in tl.steps:
        for it in s.items:
            if it.kind not in ("prefill", "decode"):
                continue  # padding (static batching) and cached prefixes are not work of the machine
            start = it.context_len - it.num_tokens
            prev = last.get(it.request_id)
            if prev is None:
                counts["waiting", "prefill"] += 1
            elif it.kind == "prefill" and start < prev[1]:  # starts over: it was preempted
                counts[prev[0], "waiting"] += 1
                counts["waiting", "prefill"] += 1
            else:
                counts[prev[0], it.kind] += 1
            last[it.request_id] = (it.kind, it.context_len)
    for r in tl.requests:
        counts["arrive", "waiting"] += 1
        if r.request_id in last and r.t_finished is not None:
            counts[last[r.request_id][0], "finished"] += 1
    return counts


def states_figure(tl: Timeline, title: str | None = None) -> go.Figure:
    """Source 000's state diagram with the engine's preemption edges, each edge labelled
    with how often it happened in `tl`."""
    c = transition_counts(tl)
    preempted = c["prefill", "waiting"] + c["decode", "waiting"]
    reasons = Counter(r.finish_reason for r in tl.requests if r.t_finished is not None)
    x = {name: 3.0 * i for i, name in enumerate(STATES)}
    w, h = 0.65, 0.35  # half width, half height of a state's box
    shapes, notes = [], []
    black, red = "#333333", "#c0392b"

    def text(x0, y0, label, color=black, **kw):
        notes.append(
            dict(x=x0, y=y0, text=label, showarrow=False, font=dict(size=12, color=color), **kw)
        )

    def head(x0, y0, x1, y1, color):
        """An arrowhead at (x1, y1), pointing from (x0, y0)."""
        notes.append(
            dict(
                x=x1,
                y=y1,
                ax=x0,
                ay=y0,
                xref="x",
                yref="y",
                axref="x",
                ayref="y",
                text="",
                showarrow=True,
                arrowhead=2,
                arrowsize=1.2,
                arrowwidth=1.6,
                arrowcolor=color,
            )
        )

    def straight(x0, x1, label):
        head(x0, 0, x1, 0, black)
        text((x0 + x1) / 2, 0.05, label, yanchor="bottom")

    def curve(x0, y0, x1, y1, cx, cy, color):
        """A quadratic Bezier from (x0, y0) to (x1, y1) with control point (cx, cy), arrowhead at the end."""
        shapes.append(
            dict(
                type="path",
                path=f"M {x0},{y0} Q {cx},{cy} {x1},{y1}",
                line=dict(color=color, width=1.6),
            )
        )
        head(x1 + 0.1 * (cx - x1), y1 + 0.1 * (cy - y1), x1, y1, color)

    for name, color in zip(STATES, ("#eeeeee", "#c6dbef", "#c7e9c0", "#f0f0f0")):
        shapes.append(
            dict(
                type="rect",
                x0=x[name] - w,
                x1=x[name] + w,
                y0=-h,
                y1=h,
                line=dict(color="#444444"),
                fillcolor=color,
                layer="below",
            )
        )
        text(x[name], 0, f"<b>{name}</b>", font_size=15)
    straight(x["waiting"] - 2.2, x["waiting"] - w, f"{c['arrive', 'waiting']:,} arrived")
    again = f"<br>({preempted:,} of them again,<br>after a preemption)" if preempted else ""
    straight(x["waiting"] + w, x["prefill"] - w, f"{c['waiting', 'prefill']:,} admitted{again}")
    straight(
        x["prefill"] + w, x["decode"] - w, f"{c['prefill', 'decode']:,} prompt done,<br>first token"
    )
    straight(x["decode"] + w, x["finished"] - w, f"{c['decode', 'finished']:,} done")
    for name, label in (
        ("prefill", "next chunk"),
        ("decode", "next token"),
    ):  # self-loops above the box
        x0 = x[name]
        curve(x0 - 0.3, h, x0 + 0.3, h, x0, h + 1.1, black)
        text(x0, h + 0.58, f"{c[name, name]:,} {label}", yanchor="bottom")
    if c["prefill", "finished"]:  # a request whose first token was its last
        curve(x["prefill"] + 0.4, h, x["finished"] - 0.4, h, x["decode"], h + 1.6, black)
        text(x["decode"] + 1.0, h + 0.85, f"{c['prefill', 'finished']:,} first token was the last")
    finish = "<br>".join(
        f"{REASONS.get(k, k)}: {v:,}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])
    )
    text(x["finished"], -h - 0.1, finish, yanchor="top")
    # preemption (recompute): back to the queue, drawn below the boxes
    curve(x["prefill"], -h, x["waiting"] + 0.2, -h, (x["waiting"] + x["prefill"]) / 2, -1.3, red)
    text(
        (x["waiting"] + x["prefill"]) / 2 + 0.1,
        -0.85,
        f"{c['prefill', 'waiting']:,} preempted<br>in prefill",
        red,
        yanchor="top",
    )
    curve(x["decode"], -h, x["waiting"] - 0.2, -h, (x["waiting"] + x["decode"]) / 2, -2.5, red)
    text(
        x["prefill"] + 0.9,
        -1.45,
        f"{c['decode', 'waiting']:,} preempted in decode",
        red,
        yanchor="top",
    )
    fig = go.Figure(go.Scatter(x=[], y=[]))
    fig.update_layout(
        shapes=shapes,
        annotations=notes,
        height=360,
        plot_bgcolor="white",
        showlegend=False,
        xaxis=dict(visible=False, range=[x["waiting"] - 2.3, x["finished"] + 1.1]),
        yaxis=dict(visible=False, range=[-1.9, 1.6]),
        margin=dict(l=10, r=10, t=50, b=10),
        title=title
        or f"{tl.meta.get('policy', '?')}: a request's states, with how often each "
        f"transition happened in this run",
    )
    return fig
