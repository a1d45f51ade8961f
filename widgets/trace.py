"""Open a run in Perfetto (ui.perfetto.dev) or chrome://tracing: one track per request."""
from __future__ import annotations

from pathlib import Path

from minilm.timeline import Timeline


def save_trace(tl: Timeline, path: str | Path) -> Path:
    """Write the timeline's Chrome trace-event JSON to `path`; returns the path."""
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"trace path {str(path)!r} must end in .json (Perfetto opens trace-event JSON)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tl.to_chrome_trace(path)
    return path
