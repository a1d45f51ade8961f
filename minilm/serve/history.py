"""What a server keeps of its run, so that one that runs all day keeps its memory flat (lesson 9).

    history = History(engine, window=1000, path="run.json")   # path: `--timeline FILE`, or None
    history.update()        # once a step's (or a command's) events are out
    steps, requests = history.since(step, request)   # GET /timeline: the window, from the cursors on
    history.close()         # the server stops: FILE is complete

An offline run keeps every request and every step: a lesson reads them all afterwards.
A server cannot: each request would stay in `Engine.requests` and its records in the
timeline forever. So, once a request's last tokens are out, it leaves the engine
(`Engine.release`), and the timeline keeps only its last `window` steps and finished
requests, what the live views draw (the live Gantt, widgets/live.py). The whole run,
block tables and token ids included, still goes to `--timeline FILE`, written as it
happens (`TimelineWriter`) rather than held until the end.

Records are numbered over the whole run (`Engine.num_steps` numbers the steps, not the
timeline's length; `first_step` is the window's first), so a live view's cursors stay
right while the window slides; one that fell more than a window
behind gets the window and skips what left it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.engine import Engine
from ..timeline import RequestRecord, StepRecord

DEFAULT_WINDOW = (
    1000  # steps and finished requests kept for the live views (`serve --timeline-window`)
)


class History:
    def __init__(
        self, engine: Engine, window: int | None = DEFAULT_WINDOW, path: str | None = None
    ):
        """`window`: steps and finished requests to keep (None: all, and no request is released)."""
        if window is not None and window < 1:
            raise ValueError(f"window={window}: must be >= 1 (records kept for the live views)")
        self.engine, self.window, self.path = engine, window, path
        self.first_step = self.first_request = 0  # run numbers of timeline.steps[0], .requests[0]
        self.seen_steps = self.seen_requests = 0  # of the timeline's records, those handed on
        self.writer = TimelineWriter(path, engine.timeline.meta) if path else None

    def update(self) -> None:
        """New records go to the file, their requests leave the engine, the oldest leave the window."""
        tl = self.engine.timeline
        steps, requests = tl.steps[self.seen_steps :], tl.requests[self.seen_requests :]
        if self.writer is not None:
            self.writer.add(steps, requests)
        if self.window is not None:
            for r in requests:  # finished: its last Tokens event went out with this step's
                self.engine.release(r.request_id)
            self.first_step += trim(tl.steps, self.window)
            self.first_request += trim(tl.requests, self.window)
        self.seen_steps, self.seen_requests = len(tl.steps), len(tl.requests)

    @property
    def next_step(self) -> int:
        return self.first_step + len(self.engine.timeline.steps)

    @property
    def next_request(self) -> int:
        return self.first_request + len(self.engine.timeline.requests)

    def since(self, step: int, request: int) -> tuple[list[StepRecord], list[RequestRecord]]:
        """Steps from run number `step` on and finished requests from `request` on, those still kept."""
        tl = self.engine.timeline
        return (
            tl.steps[max(0, step - self.first_step) :],
            tl.requests[max(0, request - self.first_request) :],
        )

    def close(self) -> None:
        self.update()
        if self.writer is not None:
            self.writer.close()
            print(
                f"minilm serve: wrote {self.path} ({self.writer.num_requests} requests, "
                f"{self.writer.num_steps} steps)",
                file=sys.stderr,
            )


def trim(records: list, keep: int) -> int:
    """Drop all but the last `keep` records, in place; how many were dropped."""
    drop = max(0, len(records) - keep)
    del records[:drop]
    return drop


class TimelineWriter:
    """A timeline written as it grows, for a run too long to hold in memory (`--timeline
    FILE`): the same JSON as `Timeline.to_json`, read back by
    `Timeline.from_json`. The JSON lists every step before the first request, so steps go
    straight to the file and requests to a scratch file that `close` appends."""

    def __init__(self, path: str | Path, meta: dict[str, Any]):
        self.path = Path(path)
        self.file = self.path.open("w")
        self.file.write(f'{{"meta": {json.dumps(meta)}, "steps": [')
        self.requests = tempfile.TemporaryFile("w+")
        self.num_steps = self.num_requests = 0

    def add(self, steps: list[StepRecord], requests: list[RequestRecord]) -> None:
        for s in steps:
            self.file.write((", " if self.num_steps else "") + json.dumps(asdict(s)))
            self.num_steps += 1
        for r in requests:
            self.requests.write((", " if self.num_requests else "") + json.dumps(asdict(r)))
            self.num_requests += 1

    def close(self) -> None:
        self.file.write('], "requests": [')
        self.requests.seek(0)
        shutil.copyfileobj(self.requests, self.file)
        self.file.write("]}")
        self.file.close()
        self.requests.close()
