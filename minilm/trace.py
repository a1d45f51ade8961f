"""A timeline as a Chrome trace (trace-event JSON): open it in https://ui.perfetto.dev or
chrome://tracing. One track for the engine's steps, one per request; a request's track
shows its queueing and each step's work on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .timeline import ITEM_KINDS, Timeline

US = 1e6  # trace events count microseconds


def chrome_trace(tl: Timeline) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "engine"}}
    ]
    tids = {r.request_id: i + 1 for i, r in enumerate(tl.requests)}
    for rid, tid in tids.items():
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "name": "thread_name",
                "args": {"name": f"request {rid}"},
            }
        )
    for s in tl.steps:
        counts = {k: s.tokens(k) for k in ITEM_KINDS}
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": 0,
                "name": f"step {s.step}",
                "ts": s.t_start * US,
                "dur": s.duration * US,
                "args": counts
                | {
                    "running": s.num_running,
                    "waiting": s.num_waiting,
                    "kv_blocks_used": s.kv_blocks_used,
                },
            }
        )
        for it in s.items:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": tids.get(it.request_id, 0),
                    "name": it.kind,
                    "ts": s.t_start * US,
                    "dur": s.duration * US,
                    "args": {"step": s.step, "tokens": it.num_tokens, "context_len": it.context_len}
                    | (
                        {"drafts": it.num_draft, "accepted": it.num_accepted}
                        if it.num_draft
                        else {}
                    ),
                }
            )
    for r in tl.requests:
        if r.t_scheduled is not None and r.t_scheduled > r.arrival:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": tids[r.request_id],
                    "name": "queued",
                    "ts": r.arrival * US,
                    "dur": (r.t_scheduled - r.arrival) * US,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": tl.meta}


def save_trace(tl: Timeline, path: str | Path) -> Path:
    """Write the timeline's trace to `path` (.json); returns the path."""
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(
            f"trace path {str(path)!r} must end in .json (Perfetto opens trace-event JSON)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(tl)))
    return path
