"""A fleet's Gantt chart: a lane group per replica on one time axis, and the KV transfers of a
disaggregated fleet (minilm/sim/cluster.py, disaggregation.py; lesson 11).

transfer   a prompt's KV crossing the link, drawn on its decode replica's row: from when the
           link was free to when the KV arrived (a wait for the link before it is `queued`)
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from minilm.sim.cluster import FleetRun

from .compare import compare_figure
from .gantt import SEGMENT_COLUMNS, segment_trace


def transfer_segments(run: FleetRun, dest: int) -> pd.DataFrame:
    """The transfers to decode replica `dest` as Gantt segments (a link wait as `queued`)."""
    rows = []
    for x in run.transfers:
        if x.dest != dest:
            continue
        if x.t_start > x.t_ready:
            rows.append([x.request_id, "queued", x.t_ready, x.t_start, None, None, 0, 0, 0, 0])
        rows.append(
            [
                x.request_id,
                "transfer",
                x.t_start,
                x.t_end,
                None,
                None,
                x.num_tokens,
                x.num_tokens,
                0,
                0,
            ]
        )
    return pd.DataFrame(rows, columns=SEGMENT_COLUMNS).astype(
        {"first_step": float, "last_step": float}
    )


def fleet_figure(run: FleetRun) -> go.Figure:
    """Every replica's Gantt, one lane group each (compare_figure's rows), with the transfers."""
    names = run.names
    fig = compare_figure(dict(zip(names, run.timelines)))
    decode_rows = [i for i, n in enumerate(names) if n.startswith("decode")]
    for j, i in enumerate(decode_rows):
        seg = transfer_segments(run, j)
        for kind in ("queued", "transfer"):
            if (seg["kind"] == kind).any():
                trace = segment_trace(seg, kind, showlegend=kind == "transfer" and j == 0)
                fig.add_trace(trace, row=i + 1, col=1)
    m = run.meta
    fig.update_layout(
        title=f"{m['policy']} · {len(run.requests)} requests · {len(names)} replicas"
        + (" (simulated)" if m.get("clock") == "simulated" else "")
    )
    return fig


def routes_frame(run: FleetRun) -> pd.DataFrame:
    """The router's decision for every request: when, where, why, and the loads it saw."""
    return pd.DataFrame(
        {
            "request": [r.request_id for r in run.routes],
            "t_ms": [r.t * 1000 for r in run.routes],
            "replica": [r.name for r in run.routes],
            "why": [r.reason for r in run.routes],
            "outstanding": [r.outstanding for r in run.routes],
            "kv_blocks_used": [r.kv_blocks_used for r in run.routes],
        }
    )
