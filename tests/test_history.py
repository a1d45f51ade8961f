"""What a server keeps of its run (minilm/serve/history.py, issue 25.6): a finished request leaves
the engine once its last tokens are out, GET /timeline reads a bounded window with cursors that stay
right while it slides, and `--timeline FILE` still gets the whole run, written as it goes."""

from __future__ import annotations

import time

import httpx
import pytest
from helpers import engine as micro_engine
from serving import docstrings_engine, serving

from minilm.config import InvalidValue
from minilm.serve.engine_loop import EngineLoop
from minilm.serve.history import TimelineWriter
from minilm.serve.messages import Add, Tokens
from minilm.timeline import Timeline

KEYS = iter(range(10**6))


def add(loop: EngineLoop, rid: str, max_tokens: int) -> int:
    key = next(KEYS)
    loop.apply(Add(key, rid, [1, 2, 3], max_tokens, {"ignore_eos": True}, arrival=0.0))
    return key


def serve_all(loop: EngineLoop) -> tuple[list, list[dict]]:
    """Step as a server does (retire after each step's events); the events, and a snapshot per step
    read from the cursors of the one before (the live Gantt's polls)."""
    events, snaps, cursor = [], [], (0, 0)
    while loop.engine.has_unfinished():
        events += loop.step()
        loop.retire()
        snaps.append(loop.snapshot(*cursor))
        cursor = snaps[-1]["next_step"], snaps[-1]["next_request"]
    return events, snaps


def test_a_finished_request_leaves_the_engine_once_its_last_tokens_are_out():
    loop = EngineLoop(micro_engine(max_num_seqs=2), window=4)
    engine = loop.engine
    for i, n in enumerate((6, 2, 3, 1, 4)):
        add(loop, f"r{i}", n)
    while engine.has_unfinished():
        events = loop.step()
        done = {e.key for e in events if isinstance(e, Tokens) and e.finish_reason}
        finished = [r.request_id for r in engine.requests.values() if r.finished]
        assert len(finished) == len(done)  # still there while its last event is being sent
        loop.retire()
        assert all(not r.finished for r in engine.requests.values())
    assert engine.requests == {} and loop.history.next_request == 5
    with pytest.raises(InvalidValue, match="'r0'.*not a finished request"):
        engine.release("r0")


def test_release_refuses_a_request_in_flight():
    loop = EngineLoop(micro_engine(), window=4)
    add(loop, "a", 5)
    loop.step()
    with pytest.raises(InvalidValue, match="'a'.*not a finished request"):
        loop.engine.release("a")
    assert "a" in loop.engine.requests


def test_the_window_is_bounded_and_its_records_keep_their_run_numbers(tmp_path):
    path = tmp_path / "run.json"
    loop = EngineLoop(micro_engine(max_num_seqs=2), window=3, timeline_path=str(path))
    for i in range(8):
        add(loop, f"r{i}", 1 + i % 4)
    _, snaps = serve_all(loop)
    tl = loop.engine.timeline
    assert len(tl.steps) == 3 and len(tl.requests) == 3
    assert [s.step for s in tl.steps] == list(
        range(loop.engine.num_steps - 3, loop.engine.num_steps)
    )
    # polled after every step, the live view got each step and each finish exactly once
    polled_steps = [s["step"] for snap in snaps for s in snap["steps"]]
    polled = [r["request_id"] for snap in snaps for r in snap["requests"]]
    assert polled_steps == list(range(loop.engine.num_steps)) and sorted(polled) == [
        f"r{i}" for i in range(8)
    ]
    # from the start: only the window (a view that fell behind skips what left it)
    whole = loop.snapshot(0, 0)
    assert [s["step"] for s in whole["steps"]] == [s.step for s in tl.steps]
    assert whole["next_step"] == loop.engine.num_steps and whole["window"] == 3
    loop.history.close()
    run = Timeline.from_json(path)  # the whole run: every step, every request, block tables too
    assert [s.step for s in run.steps] == list(range(loop.engine.num_steps))
    assert sorted(r.request_id for r in run.requests) == [f"r{i}" for i in range(8)]
    assert run.requests[-3:] == tl.requests and all(s.kv_blocks is not None for s in run.steps)


def test_the_timeline_writer_writes_what_to_json_writes(tmp_path):
    engine = micro_engine(max_num_seqs=2)
    for i in range(4):
        engine.add_request(f"r{i}", [1, 2, 3], max_tokens=2 + i)
    tl = engine.run()
    writer = TimelineWriter(tmp_path / "t.json", tl.meta)
    pieces = [tl.steps[k : k + 3] for k in range(0, len(tl.steps), 3)]  # as a server writes
    for k, steps in enumerate(pieces):
        writer.add(steps, tl.requests[k : k + 1] if k < len(pieces) - 1 else tl.requests[k:])
    writer.close()
    assert (tmp_path / "t.json").read_text() == tl.to_json()


def test_a_server_forgets_what_it_has_sent_and_its_live_feed_is_bounded(tmp_path):
    path = tmp_path / "run.json"
    with serving(docstrings_engine(max_num_seqs=4), window=5, timeline_path=str(path)) as (
        url,
        engine,
        _,
    ):
        for i in range(8):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "Return the", "max_tokens": 3})
            assert r.status_code == 200
        deadline = time.monotonic() + 10  # the last release follows its response by a moment
        while engine.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.requests == {}
        feed = httpx.get(f"{url}/timeline").json()
    assert len(feed["steps"]) == 5 and len(feed["requests"]) == 5 and feed["next_request"] == 8
    run = Timeline.from_json(path)
    assert len(run.requests) == 8 and len(run.steps) == feed["next_step"]
    assert [r.request_id for r in run.requests[-5:]] == [r["request_id"] for r in feed["requests"]]
