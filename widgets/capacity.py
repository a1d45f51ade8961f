"""The capacity search's answer as a figure (minilm/sim/search.py; lesson 11): each
deployment's cost per hour against its capacity, the load as a line, the Pareto front."""

from __future__ import annotations

import plotly.graph_objects as go

from minilm.sim.search import pareto


def capacity_figure(rows: list[dict], load: float | None = None) -> go.Figure:
    """`rows` from search.rank: a point a deployment (an open triangle where the search stopped
    at its ceiling: at least that much), the Pareto front, and `load`, the rate to serve."""
    built = [r for r in rows if not r["error"]]
    fig = go.Figure()
    for meets, name, color in ((True, "meets the load", "#2a9d8f"), (False, "does not", "#e76f51")):
        group = [r for r in built if r["meets"] == meets]
        fig.add_trace(
            go.Scatter(
                x=[r["usd_per_hour"] for r in group],
                y=[r["goodput_req_per_s"] for r in group],
                mode="markers",
                name=name,
                marker=dict(
                    color=color,
                    size=9,
                    symbol=["triangle-up-open" if r["capped"] else "circle" for r in group],
                ),
                text=[r["deployment"] for r in group],
                hovertemplate="%{text}<br>$%{x:.2f}/h, %{y:.1f} req/s<extra></extra>",
            )
        )
    front = pareto(rows)
    fig.add_trace(
        go.Scatter(
            x=[r["usd_per_hour"] for r in front],
            y=[r["goodput_req_per_s"] for r in front],
            mode="lines",
            line=dict(shape="hv", color="#264653", dash="dot"),
            name="Pareto front",
            hoverinfo="skip",
        )
    )
    if load is not None:
        fig.add_hline(y=load, line_dash="dash", annotation_text=f"load {load:g} req/s")
    fig.update_layout(
        title="Capacity against cost (simulated; GPU prices assumed)",
        xaxis_title="cost ($/hour)",
        yaxis_title="capacity (req/s within the SLOs)",
        template="plotly_white",
    )
    return fig
