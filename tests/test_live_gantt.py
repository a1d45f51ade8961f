"""widgets.live_gantt: the chart grows while a server serves, without blocking the event loop (issue 13)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from helpers import engine as micro_engine
from serving import docstrings_engine, serving

import widgets
from minilm.client import bearer


def bar_rows(fig, name: str) -> set[str]:
    return {y for t in fig.data if t.name == name for y in t.y}


@pytest.mark.parametrize("api_key", [None, "room-key"])
def test_live_gantt_of_a_server_shows_requests_in_flight_then_finished(api_key):
    """With a key set too: the chart reads /timeline, open (lengths and times only), while requests need the key."""
    with serving(docstrings_engine(max_num_seqs=4), api_key=api_key) as (url, engine, _):

        async def scenario():
            live = widgets.live_gantt(url, interval=0.05)
            async with httpx.AsyncClient(timeout=60, headers=bearer(api_key)) as client:
                body = {
                    "prompt": "Return the",
                    "max_tokens": 240,
                    "ignore_eos": True,
                }  # ~1 s of decodes
                long = asyncio.ensure_future(
                    client.post(
                        f"{url}/v1/completions", json=body, headers={"X-Request-Id": "long"}
                    )
                )
                for _ in range(
                    200
                ):  # the poller runs meanwhile (the loop is free): until it has seen "long"
                    await asyncio.sleep(0.05)
                    if live.unfinished or long.done():
                        break
                in_flight = [r.request_id for r in live.unfinished]
                drawn_in_flight = bar_rows(live.gantt, "decode") | bar_rows(live.gantt, "prefill")
                await long
                await asyncio.gather(
                    *(
                        client.post(
                            f"{url}/v1/completions",
                            json={**body, "max_tokens": 3},
                            headers={"X-Request-Id": f"short{i}"},
                        )
                        for i in range(3)
                    )
                )
            await live.refresh()
            live.stop()
            return live, in_flight, drawn_in_flight

        live, in_flight, drawn_in_flight = asyncio.run(scenario())
        assert in_flight == ["long"] and "long" in drawn_in_flight
        assert live.polls >= 3 and live.unfinished == []
        assert [r.request_id for r in live.timeline.requests] == [
            "long",
            "short0",
            "short1",
            "short2",
        ]
        assert len(live.timeline.steps) == len(engine.timeline.steps)
        assert bar_rows(live.gantt, "decode") == {"long", "short0", "short1", "short2"}
        assert "4 finished" in live.status.value
        assert all(
            r.output_ids == [] for r in live.timeline.requests
        )  # no token ids came with the feed
        assert [r.output_len for r in live.timeline.requests] == [240, 3, 3, 3]


def test_live_gantt_of_an_engine_stepped_in_the_same_loop():
    engine = micro_engine(max_num_seqs=2)
    for i in range(3):
        engine.add_request(f"r{i}", prompt_ids=[1, 2, 3], max_tokens=4, ignore_eos=True)

    async def scenario():
        live = widgets.live_gantt(engine, interval=0.01, steps=False)
        while engine.step() is not None:
            await asyncio.sleep(0.01)
        await live.refresh()
        live.stop()
        return live

    live = asyncio.run(scenario())
    assert len(live.timeline.steps) == len(engine.timeline.steps) and live.steps is None
    assert bar_rows(live.gantt, "decode") == {"r0", "r1", "r2"}


def test_live_gantt_keeps_what_a_speculating_server_recorded():
    """The server's timeline JSON parsed by Timeline's own parsing: drafts, accepted and draft time survive."""
    spec = {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }
    with serving(docstrings_engine(max_num_seqs=4, speculative_config=spec)) as (url, engine, _):

        async def scenario():
            live = widgets.live_gantt(url, interval=0.05)
            async with httpx.AsyncClient(timeout=60) as client:
                await client.post(
                    f"{url}/v1/completions",
                    json={"prompt": 'def add(a, b):\n    """', "max_tokens": 24, "temperature": 0},
                )
            await live.refresh()
            live.stop()
            return live

        live = asyncio.run(scenario())
        drawn, recorded = live.timeline.steps, engine.timeline.steps
        assert [s.items for s in drawn] == [s.items for s in recorded]
        assert [s.draft_time for s in drawn] == [s.draft_time for s in recorded]
        assert sum(i.num_accepted for s in drawn for i in s.items) > 0
        assert bar_rows(live.gantt, "draft accepted") == {live.timeline.requests[0].request_id}


def test_live_gantt_keeps_the_servers_window_and_follows_its_cursors():
    """A server keeping 4 steps and requests (serve --timeline-window 4): the chart keeps as many,
    the last ones, and polls from the server's run numbers (not from what it holds)."""
    with serving(docstrings_engine(max_num_seqs=4), window=4) as (url, engine, _):

        async def scenario():
            live = widgets.live_gantt(url, interval=0.02, steps=False)
            async with httpx.AsyncClient(timeout=60) as client:
                for i in range(6):
                    await client.post(
                        f"{url}/v1/completions",
                        json={"prompt": "Return the", "max_tokens": 3, "ignore_eos": True},
                        headers={"X-Request-Id": f"r{i}"},
                    )
                    await asyncio.sleep(0.05)  # a poll or two in between
            await live.refresh()
            live.stop()
            return live

        live = asyncio.run(scenario())
        steps = [s.step for s in live.timeline.steps]
        assert steps == [s.step for s in engine.timeline.steps] and len(steps) == 4
        assert steps == list(range(engine.num_steps - 4, engine.num_steps))
        assert [r.request_id for r in live.timeline.requests] == ["r2", "r3", "r4", "r5"]
        assert live.cursor == {"since": engine.num_steps, "since_request": 6}
