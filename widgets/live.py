"""A Gantt chart that grows while an engine serves (lesson 9, the lecture demo's second part).

    live = widgets.live_gantt("http://127.0.0.1:8000")   # a `python -m minilm serve` server
    live                                                  # shows it; rows appear as requests arrive
    live.stop()

Every `interval` seconds it asks the server for what is new (`GET /timeline?since=STEP`:
the steps and finished requests since the last poll, and the unfinished requests as they
are now) and redraws the shown `FigureWidget`s in one update each. Like the server, it
keeps only the last `--timeline-window` steps and finished requests (serve/history.py),
so a chart left open all day draws the last minutes, not the whole day. The polling is an
asyncio task in the kernel's own event loop, so the kernel stays free: cells run while
the chart grows (a cell that blocks the kernel, like `time.sleep`, pauses it; `await`
does not).

Given an `Engine` instead of a URL, it draws that engine's timeline as it grows (an
engine stepped elsewhere, e.g. in a thread); requests show once they run, from the steps.

A server with several engine cores (`serve --data-parallel-size N`) says so in its first
answer; from then on each poll asks every core (`/timeline?engine=I`, each core with its
own cursors: a `Feed` each) and the Gantt draws a lane group per core, the simulated
fleet's figure (widgets/fleet.py `fleet_figure`). The step view shows core 0's steps.
"""

from __future__ import annotations

import asyncio
import dataclasses

import ipywidgets as W
import plotly.graph_objects as go

from minilm.sim.cluster import FleetRun
from minilm.timeline import RequestRecord, Timeline

from .fleet import fleet_figure
from .gantt import gantt_figure
from .inplace import fill_width, update_figure
from .steps import steps_figure


class Feed:
    """One engine core's records as the chart holds them, read from its cursors on."""

    def __init__(self, engine: int = 0):
        self.engine = engine
        self.finished: list[RequestRecord] = []  # finished requests, in the order they finished
        self.unfinished: list[RequestRecord] = []  # the core's unfinished requests at the last poll
        self.timeline = Timeline()  # what is drawn: steps + finished + unfinished
        self.cursor = {"since": 0, "since_request": 0}  # the server's numbers of what comes next
        self.now = 0.0

    def take(self, data: dict) -> bool:
        """One /timeline answer; True when something changed."""
        # the timeline's own parsing, finished and unfinished requests together (every field survives)
        new = Timeline.from_dict({**data, "requests": data["requests"] + data["unfinished"]})
        steps, n = new.steps, len(data["requests"])
        finished, unfinished = new.requests[:n], new.requests[n:]
        changed = bool(steps or finished) or [r.request_id for r in unfinished] != [
            r.request_id for r in self.unfinished
        ]
        self.timeline.meta, self.now = data["meta"], data["now"]
        self.cursor = {"since": data["next_step"], "since_request": data["next_request"]}
        keep = data["window"]
        self.timeline.steps = (self.timeline.steps + steps)[-keep:]
        self.finished = (self.finished + finished)[-keep:]
        self.unfinished = unfinished
        return changed or bool(unfinished)  # waiting rows grow with time

    def shown_requests(self, now: float) -> list[RequestRecord]:
        """Finished requests, then unfinished ones; one still in the queue is drawn queued until `now`
        (the core's clock)."""
        waiting = [
            dataclasses.replace(r, t_scheduled=now) if r.t_scheduled is None else r
            for r in self.unfinished
        ]
        return self.finished + waiting


class LiveGantt:
    def __init__(self, source, interval: float = 0.5, steps: bool = True):
        """`source`: a server's base URL or an Engine. `interval`: seconds between polls."""
        if interval <= 0:
            raise ValueError(f"interval={interval}: must be > 0 seconds")
        self.source, self.interval = source, interval
        self.url = source.rstrip("/") if isinstance(source, str) else None
        self.engine = None if self.url else source
        if self.engine is not None and not hasattr(self.engine, "timeline"):
            raise ValueError(
                f"live_gantt({source!r}): give a server URL ('http://host:port') or an Engine"
            )
        self.feeds = [Feed(0)]  # one per engine core of the server (one for an Engine)
        self.polls = self.errors = 0
        self.lock = asyncio.Lock()  # one poll at a time: `refresh` and the task share the cursors
        self.status = W.HTML("starting…")
        self.gantt = fill_width(
            go.FigureWidget(gantt_figure(self.timeline, title="waiting for requests"))
        )
        self.steps = fill_width(go.FigureWidget(steps_figure(self.timeline))) if steps else None
        self.widget = W.VBox([self.status, self.gantt] + ([self.steps] if steps else []))
        self.task = asyncio.ensure_future(self.run())

    # core 0's records (the only core's, unless the server has several)
    timeline = property(lambda self: self.feeds[0].timeline)
    finished = property(lambda self: self.feeds[0].finished)
    unfinished = property(lambda self: self.feeds[0].unfinished)
    cursor = property(lambda self: self.feeds[0].cursor)
    now = property(lambda self: max(f.now for f in self.feeds))

    # ---- reading the source ----------------------------------------------------------
    async def poll(self) -> bool:
        """Fetch what is new; True when something changed."""
        async with self.lock:
            return await self.fetch()

    async def fetch(self) -> bool:
        if self.engine is not None:
            return self.read_engine()
        import httpx

        changed = False
        async with httpx.AsyncClient(timeout=10) as client:
            i = 0
            while i < len(self.feeds):  # the first answer says how many cores there are
                feed = self.feeds[i]
                params = feed.cursor | {"engine": feed.engine}
                data = (
                    (await client.get(f"{self.url}/timeline", params=params))
                    .raise_for_status()
                    .json()
                )
                changed |= feed.take(data)
                for k in range(len(self.feeds), data.get("data_parallel_size", 1)):
                    self.feeds.append(Feed(k))
                i += 1
        return changed

    def read_engine(self) -> bool:
        feed, tl = self.feeds[0], self.engine.timeline
        steps, finished = tl.steps[len(feed.timeline.steps) :], tl.requests[len(feed.finished) :]
        feed.timeline.meta = tl.meta
        feed.timeline.steps += steps
        feed.finished += finished
        feed.now = feed.timeline.steps[-1].t_end if feed.timeline.steps else 0.0
        return bool(steps or finished)

    # ---- drawing ------------------------------------------------------------------------
    def redraw(self) -> None:
        for feed in self.feeds:
            feed.timeline.requests = feed.shown_requests(feed.now)
        tl = self.timeline
        if len(self.feeds) == 1:
            update_figure(self.gantt, gantt_figure(tl), keep_view=True)
        else:  # a lane group per engine core: the simulated fleet's figure
            cores = [f.timeline for f in self.feeds]
            meta = tl.meta | {"policy": f"{tl.meta.get('policy', '?')} x{len(cores)} engine cores"}
            run = FleetRun(cores, [], [r for c in cores for r in c.requests], meta)
            update_figure(self.gantt, fleet_figure(run), keep_view=True)
        if self.steps is not None:
            update_figure(self.steps, steps_figure(tl), keep_view=True)
        unfinished = [r for f in self.feeds for r in f.unfinished]
        running = sum(r.t_scheduled is not None for r in unfinished)
        cores = f" · {len(self.feeds)} engine cores" if len(self.feeds) > 1 else ""
        self.status.value = (
            f"<b>{self.url or 'engine'}</b> · {tl.meta.get('policy', '?')}{cores} · "
            f"{sum(len(f.finished) for f in self.feeds)} finished, {len(unfinished)} in flight "
            f"({len(unfinished) - running} queued) · "
            f"{sum(len(f.timeline.steps) for f in self.feeds)} steps · "
            f"server time {self.now:.1f} s"
        )

    async def run(self) -> None:
        while True:
            try:
                if await self.poll():
                    self.redraw()
                self.polls += 1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the server went away: say so, keep trying a little
                self.errors += 1
                self.status.value = (
                    f"<b>{self.url}</b>: {type(e).__name__}: {e} (poll {self.errors} failed)"
                )
                if self.errors >= 20:
                    return
            await asyncio.sleep(self.interval)

    async def refresh(self) -> None:
        """One poll and redraw now (`await live.refresh()`)."""
        await self.poll()
        self.redraw()

    def stop(self) -> None:
        """Stop polling; the figures keep what they show."""
        self.task.cancel()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def live_gantt(url_or_engine, interval: float = 0.5, steps: bool = True) -> LiveGantt:
    """A live Gantt (and step view) of a server at `url_or_engine`, or of an Engine; see LiveGantt."""
    return LiveGantt(url_or_engine, interval, steps)
