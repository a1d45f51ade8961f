"""Latency views: TTFT and ITL distributions per policy, and a throughput-latency sweep.

A CDF shows the whole distribution: its median and its tail (p99) in one line per
policy. ITL is the gap between consecutive tokens of one request; a long prompt run
in one step shows as a tail of long gaps that chunked prefill removes (lesson 6).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm.metrics import itls, summarize, ttfts
from minilm.timeline import Timeline

from .gantt import MS

POLICY_COLORS = {"static": "#7f7f7f", "continuous": "#1f77b4", "chunked": "#2ca02c"}


def policy_color(name: str, i: int) -> str:
    return POLICY_COLORS.get(name, ("#d62728", "#9467bd", "#8c564b", "#e377c2")[i % 4])


def cdf_xy(values_s: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values in ms and the fraction of values <= each."""
    x = np.sort(np.asarray(values_s, dtype=float)) * MS
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def latency_cdfs_figure(timelines: dict[str, Timeline]) -> go.Figure:
    """TTFT (left) and ITL (right) CDFs, one line per named timeline. A client's failed requests are
    not in them (minilm/metrics.py); the legend says how many each run left out."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("time to first token", "inter-token latency")
    )
    for i, (name, tl) in enumerate(timelines.items()):
        failed = sum(r.failed for r in tl.requests)
        label = name + (f" (without its {failed} failed)" if failed else "")
        for col, values in ((1, ttfts(tl)), (2, itls(tl))):
            x, y = cdf_xy(values)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    name=label,
                    legendgroup=name,
                    showlegend=col == 1,
                    line=dict(color=policy_color(name, i), shape="hv"),
                    hovertemplate=name + ": %{y:.0%} <= %{x:.2f} ms<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="ms")
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1, range=[0, 1.02])
    fig.update_yaxes(title_text="fraction of token gaps", row=1, col=2, range=[0, 1.02])
    fig.update_layout(
        title=f"latency distributions{simulated_note(timelines.values())}", height=380
    )
    return fig


def simulated_note(tls) -> str:
    return " (simulated time)" if any(t.meta.get("clock") == "simulated" for t in tls) else ""


def sweep(
    run: Callable[..., Timeline], policies: list[str], knob: str, values: list
) -> pd.DataFrame:
    """Run `run(policy=p, **{knob: v})` for every policy and value; one `summarize` row each."""
    rows = []
    for p in policies:
        for v in values:
            rows.append({**summarize(run(policy=p, **{knob: v})), "knob": knob, "value": v})
    return pd.DataFrame(rows)


def sweep_figure(df: pd.DataFrame, latency: str = "itl_p99") -> go.Figure:
    """Throughput (x) against a latency percentile (y) from a `sweep` table; a line per policy,
    each point labelled with its knob value. Up and left is worse; the knee is the trade-off."""
    if latency not in df.columns:
        allowed = [c for c in df.columns if c.endswith(("_p50", "_p90", "_p99"))]
        raise ValueError(f"latency={latency!r}; allowed: {', '.join(allowed)}")
    fig = go.Figure()
    for i, (policy, part) in enumerate(df.groupby("policy", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=part["output_tok_per_s"],
                y=part[latency] * MS,
                mode="lines+markers+text",
                name=policy,
                text=[f"{part['knob'].iloc[0]}={v}" for v in part["value"]],
                textposition="top center",
                line=dict(color=policy_color(policy, i)),
                hovertemplate="%{text}: %{x:.0f} tok/s, %{y:.2f} ms<extra>" + policy + "</extra>",
            )
        )
    clock = " (simulated)" if (df.get("clock") == "simulated").any() else ""
    fig.update_layout(
        title=f"throughput vs {latency}{clock}",
        xaxis_title="output tokens / s",
        yaxis_title=f"{latency} (ms)",
        height=420,
    )
    return fig
