"""Timeline exports and the metrics computed from them."""

import json

import numpy as np
import pytest
from helpers import engine

from minilm import Timeline, items_df, requests_df, steps_df, summarize
from minilm.metrics import itls, ttfts


@pytest.fixture(scope="module")
def timeline():
    e = engine(
        "chunked", max_model_len=128, max_num_seqs=3, max_num_batched_tokens=12, block_size=4
    )
    for i, (p, m, t) in enumerate([(20, 6, 0.0), (5, 4, 0.0), (9, 7, 0.0), (3, 3, 0.5)]):
        e.add_request(f"q{i}", list(range(1, p + 1)), max_tokens=m, arrival=t, ignore_eos=True)
    return e.run()


def test_records_are_consistent(timeline):
    tl = timeline
    assert [s.step for s in tl.steps] == list(range(len(tl.steps)))
    assert all(a.t_end <= b.t_start for a, b in zip(tl.steps, tl.steps[1:]))
    for r in tl.requests:
        produced = [
            s.t_end
            for s in tl.steps
            for i in s.items
            if i.request_id == r.request_id and i.kind == "decode"
        ]
        assert r.token_times[1:] == produced  # the first token comes from the prefill's last chunk
    late = next(r for r in tl.requests if r.request_id == "q3")
    assert late.t_scheduled >= 0.5, "the engine jumps to an arrival, it does not admit early"


def test_json_round_trip(timeline, tmp_path):
    back = Timeline.from_json(timeline.to_json(tmp_path / "t.json"))
    assert back.to_dict() == timeline.to_dict()
    assert Timeline.from_json(tmp_path / "t.json").to_dict() == timeline.to_dict()


def test_dataframes(timeline):
    steps, items, reqs = steps_df(timeline), items_df(timeline), requests_df(timeline)
    assert len(steps) == len(timeline.steps) and len(reqs) == 4
    assert items.num_tokens.sum() == steps.num_tokens.sum()
    assert (
        steps.prefill_tokens + steps.decode_tokens + steps.padding_tokens == steps.num_tokens
    ).all()
    assert (steps.draft_tokens == 0).all() and (
        steps.verify_time == steps.model_time
    ).all()  # no speculation
    assert list(items_df(Timeline()).columns) == list(
        items.columns
    )  # an empty run has the same columns


def test_chrome_trace(timeline, tmp_path):
    from minilm.trace import chrome_trace, save_trace

    trace = chrome_trace(timeline)
    events = json.loads(save_trace(timeline, tmp_path / "trace.json").read_text())["traceEvents"]
    assert events == trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and "ts" in e for e in spans)
    steps = [e for e in spans if e["tid"] == 0]
    assert len(steps) == len(timeline.steps)
    assert steps[0]["ts"] == pytest.approx(timeline.steps[0].t_start * 1e6)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"engine", "request q0"} <= names


def test_metrics_from_records(timeline):
    m = summarize(timeline, ttft_slo=1e9, tpot_slo=1e9)
    reqs = timeline.requests
    assert m["output_tokens"] == sum(r.output_len for r in reqs) == 6 + 4 + 7 + 3
    assert m["ttft_p50"] == pytest.approx(
        np.percentile([r.t_first_token - r.arrival for r in reqs], 50)
    )
    assert len(itls(timeline)) == sum(r.output_len - 1 for r in reqs)
    assert len(ttfts(timeline)) == 4
    assert m["slo_attainment"] == 1.0
    assert summarize(timeline, ttft_slo=0.0)["slo_attainment"] == 0.0
    assert m["padding_fraction"] == 0.0 and m["preemptions"] == 0
    span = timeline.steps[-1].t_end
    assert m["output_tok_per_s"] == pytest.approx(20 / span)


def test_step_time_is_the_engines_work_not_the_recording(monkeypatch):
    """The timeline's own bookkeeping runs after the clock stops: make it slow, and no
    measured step gets longer. The model's share of each step is recorded apart."""
    import time

    import minilm.core.engine

    real = minilm.core.engine.StepItem

    def slow_item(*args):
        time.sleep(0.05)
        return real(*args)

    monkeypatch.setattr(minilm.core.engine, "StepItem", slow_item)
    e = engine(
        "chunked", max_model_len=128, max_num_seqs=3, max_num_batched_tokens=12, block_size=4
    )
    e.add_request("a", list(range(1, 15)), max_tokens=3, ignore_eos=True)
    tl = e.run()
    assert all(s.duration < 0.05 for s in tl.steps), [round(s.duration, 3) for s in tl.steps]
    assert all(0 < s.model_time <= s.duration for s in tl.steps)


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_abort_frees_now_and_records_the_request_once(policy):
    e = engine(policy, max_model_len=128, max_num_seqs=2, block_size=4)
    for i in range(4):
        e.add_request(f"a{i}", list(range(1, 10)), max_tokens=8, ignore_eos=True)
    e.step()
    e.step()
    running = next(r for r in e.requests.values() if r.status.value == "running").request_id
    held_before = e.kv_manager.num_used_blocks
    assert e.abort(running) and e.abort("a3")  # one running, one still waiting
    assert not e.abort(running), "aborting twice finishes nothing twice"
    if policy != "static":  # a static batch keeps a row's KV until the batch ends
        assert e.kv_manager.num_used_blocks < held_before
    tl = e.run()
    reasons = {r.request_id: r.finish_reason for r in tl.requests}
    assert sorted(reasons) == [f"a{i}" for i in range(4)]
    assert reasons[running] == reasons["a3"] == "aborted"
    assert e.kv_manager.num_free_blocks == e.kv_manager.num_blocks
    with pytest.raises(ValueError, match="request_id='nope': unknown"):
        e.abort("nope")


def test_wall_clock_counts_idle_time():
    import time

    from minilm.core.clock import WallClock

    e = engine("continuous", max_model_len=64, clock=WallClock())
    e.add_request("a", [1, 2, 3], max_tokens=2, arrival=e.clock.now)
    e.run()
    time.sleep(0.05)
    e.add_request("b", [1, 2, 3], max_tokens=2, arrival=e.clock.now)
    tl = e.run()
    a, b = tl.requests
    assert b.arrival - a.t_finished >= 0.05 and b.t_first_token >= b.arrival
    assert tl.meta["clock"] == "wall"
