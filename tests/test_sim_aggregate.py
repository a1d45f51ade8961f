"""A million simulated requests in a few GB (docs/SIMULATOR.md, "Memory"): compact prompts
(numpy arrays) run as list prompts do, and `record="aggregate"` (minilm/record.py) keeps
totals whose `summarize` equals the full timeline's, ITL percentiles and worst gaps included."""

import numpy as np
import pytest

from minilm.config import InvalidValue
from minilm.metrics import itls, summarize, weighted_percentiles, worst_itls
from minilm.record import AggregateStep
from minilm.sim import simulated_engine
from minilm.workload import make_workload


def engine_for(record: str, policy: str, fast: bool = True, **knobs):
    return simulated_engine(
        "llama-3-8b",
        "h100",
        policy,
        fast_forward=fast,
        max_model_len=1024,
        record=record,
        **knobs,
    )


def run(record, policy, fast=True, workload="mixed", compact=False, rate=40.0, n=80, **knobs):
    engine = engine_for(record, policy, fast, **knobs)
    specs = make_workload(
        workload,
        n,
        seed=3,
        vocab_size=engine.model_config.vocab_size,
        rate=rate,
        max_model_len=1024,
        compact=compact,
    )
    engine.add_workload(specs)
    return engine, engine.run()


def same_summary(policy: str, fast: bool = True, **kw) -> dict:
    """summarize of both records, compared as text (a NaN equals itself); the full one's."""
    _, full = run("full", policy, fast, **kw)
    _, agg = run("aggregate", policy, fast, **kw)
    a, b = summarize(full), summarize(agg)
    assert str(b) == str(a)
    assert sorted(itls(agg)) == sorted(itls(full))
    assert worst_itls(agg) == worst_itls(full)
    return a


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "step"])
@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@pytest.mark.parametrize("caching", [False, True])
def test_aggregate_summary_equals_full(policy, caching, fast):
    workload = "shared-prefix" if caching else "mixed"
    m = same_summary(policy, fast, workload=workload, enable_prefix_caching=caching, max_num_seqs=8)
    assert m["itl_p50"] > 0 and (m["prefix_cache_hit_rate"] > 0) == caching


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "step"])
@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@pytest.mark.parametrize("caching", [False, True])
def test_aggregate_summary_equals_full_with_preemption(policy, caching, fast):
    # a small cache preempts: a preempted request's next token comes many steps later
    m = same_summary(
        policy, fast, num_blocks=80, max_num_seqs=16, enable_prefix_caching=caching, rate=None
    )
    assert m["preemptions"] > 0


def test_aggregate_summary_equals_full_static_and_speculation():
    fast, step = (
        same_summary("static", max_num_seqs=8),
        same_summary("static", False, max_num_seqs=8),
    )
    assert str(fast) == str(step)  # as text: a NaN equals itself
    # several tokens a step: gaps of 0.0, listed apart
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    m = same_summary("chunked", speculative_config=spec, acceptance=0.7, max_num_seqs=8)
    assert m["spec_draft_tokens"] > 0


def test_aggregate_steps_hold_no_items_and_forget_finished_requests():
    engine, tl = run("aggregate", "chunked", compact=True, max_num_seqs=8)
    assert engine.bulk_steps + engine.fast_steps > 0  # the fast path ran
    assert all(isinstance(s, AggregateStep) for s in tl.steps)
    assert not any(hasattr(s, "ids") or "items" in vars(s) for s in tl.steps)
    assert all(r.token_times == [] and r.output_ids == [] for r in tl.requests)
    assert engine.requests == {} and len(engine.finished_ids) == len(tl.requests) == 80
    with pytest.raises(ValueError, match="record='full'"):
        tl.steps[0].items  # noqa: B018  (a view that needs items says which knob)


def test_a_finished_id_is_still_refused_in_aggregate_mode():
    engine = engine_for("aggregate", "continuous")
    engine.add_request("a", [1, 2, 3], max_tokens=4)
    engine.run()
    assert "a" not in engine.requests and engine.abort("a") is False
    with pytest.raises(InvalidValue, match="already in use"):
        engine.add_request("a", [1, 2, 3], max_tokens=4)
    engine.add_request("b", [1, 2, 3], max_tokens=4)  # a new id runs
    assert [r.request_id for r in engine.run().requests] == ["a", "b"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "step"])
@pytest.mark.parametrize("caching", [False, True])
def test_compact_prompts_give_the_list_prompts_timeline(caching, fast):
    knobs = dict(enable_prefix_caching=caching, max_num_seqs=8, num_blocks=200)
    _, lists = run("full", "chunked", fast, rate=None, **knobs)
    engine, arrays = run("full", "chunked", fast, compact=True, rate=None, **knobs)
    assert all(isinstance(r.prompt_ids, np.ndarray) for r in engine.requests.values())
    assert arrays.steps == lists.steps
    assert arrays.requests == lists.requests


def test_a_bad_id_in_a_compact_prompt_is_refused_by_name():
    engine = engine_for("full", "continuous")
    vocab = engine.model_config.vocab_size
    for bad in (vocab + 5, -3):
        with pytest.raises(InvalidValue, match=f"{bad}.*outside the vocabulary"):
            engine.add_request("r", np.array([1, bad, 2, vocab], np.int32), max_tokens=4)
    with pytest.raises(InvalidValue, match="1.5"):
        engine.add_request("r", np.array([1.5, 2.0]), max_tokens=4)
    assert engine.requests == {}


def test_weighted_percentiles_equal_numpys():
    # bit for bit: numpy interpolates from the nearer neighbour, which a + (b - a) * t is not
    rng = np.random.default_rng(0)
    qs = (0, 1, 50, 90, 99, 99.9, 100)
    for n in [1, 2, 3, 5, 100] + [int(k) for k in rng.integers(2, 50, 200)]:
        values = rng.exponential(1.0, n)
        values[: n // 3] = values[0]  # a value many gaps share
        counts = rng.integers(0, 6, n)
        counts[0] += 1
        want = np.percentile(np.repeat(values, counts), qs).tolist()
        assert weighted_percentiles(values, counts, qs) == want
