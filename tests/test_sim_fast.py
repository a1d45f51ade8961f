"""The simulator's fast-forward (minilm/sim/fastforward.py) makes the timeline the step-by-step
loop makes: the same steps (count, times, items, KV figures, block tables) and the same
request records, on every policy, with prefix caching, speculation and preemption."""

import gc
import weakref

import pytest

from minilm.config import EngineConfig
from minilm.core.clock import SimulatedClock
from minilm.core.kv_cache import BlockPool
from minilm.metrics import summarize
from minilm.sim import simulated_engine
from minilm.sim.costmodel import CostModel
from minilm.sim.executor import SimulatedExecutor
from minilm.sim.fastforward import DecodeStep, SimulatedEngine
from minilm.workload import RequestSpec, make_workload


def run(
    fast: bool, policy: str, workload: str = "mixed", n: int = 80, rate=40.0, sampling=None, **knobs
):
    engine = simulated_engine(
        "llama-3-8b", "h100", policy, fast_forward=fast, max_model_len=1024, **knobs
    )
    specs = make_workload(
        workload,
        n,
        seed=3,
        vocab_size=engine.model_config.vocab_size,
        rate=rate,
        max_model_len=1024,
    )
    engine.add_workload(specs, **(sampling or {}))
    return engine, engine.run()


def same_run(policy: str, **kw) -> int:
    """Both timelines, compared whole (floats with ==); the steps fast-forwarded."""
    slow, a = run(False, policy, **kw)
    fast, b = run(True, policy, **kw)
    # summarize first: it counts a fast step's decodes without making its items
    assert str(summarize(b)) == str(summarize(a))  # as text: a NaN equals itself
    assert slow.fast_steps == slow.bulk_steps == 0  # the switch turns both off
    assert len(b.steps) == len(a.steps)
    for x, y in zip(a.steps, b.steps):
        assert (x.t_start, x.t_end) == (y.t_start, y.t_end)
        assert x == y
    assert b.requests == a.requests
    assert b.to_dict() == a.to_dict()
    return fast.fast_steps


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@pytest.mark.parametrize("caching", [False, True])
def test_same_timeline(policy, caching):
    workload = "shared-prefix" if caching else "mixed"
    n = same_run(policy, workload=workload, enable_prefix_caching=caching, max_num_seqs=8)
    assert n > 0  # the fast path ran, so the comparison tested it


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_same_timeline_full_seats_and_all_at_once(policy):
    # every request at t=0 and few seats: runs with a waiting queue behind a full batch
    assert same_run(policy, rate=None, max_num_seqs=4) > 0


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_same_timeline_with_preemption(policy):
    slow, a = run(False, policy, num_blocks=80, max_num_seqs=16)
    assert sum(s.num_preempted for s in a.steps) > 0  # the small cache preempts
    assert same_run(policy, num_blocks=80, max_num_seqs=16) > 0


@pytest.mark.parametrize(
    "knobs",
    [
        {"max_num_seqs": 8},
        {"max_num_seqs": 4, "rate": None},
        {"max_num_seqs": 8, "workload": "shared-prefix", "enable_prefix_caching": True},
    ],
)
def test_same_timeline_static(knobs):
    # a static batch's lanes decode while its dead rows pad (StaticPolicy.pad_dead_rows)
    assert same_run("static", **knobs) > 0


def test_same_timeline_static_rows_ending_early():
    # rows that stop at their first token die at once; the rest decode beside their padding
    def go(fast: bool):
        engine = simulated_engine("llama-3-8b", "h100", "static", fast_forward=fast, max_num_seqs=6)
        stop = (engine.executor.token_id,)
        for i in range(30):
            engine.add_request(
                f"r{i}",
                [3] * (5 + 37 * i % 190),
                max_tokens=1 + 53 * i % 150,
                arrival=0.01 * i,
                stop_token_ids=stop if i % 3 == 0 else (),
            )
        return engine, engine.run()

    (_, a), (fast, b) = go(False), go(True)
    assert fast.fast_steps > 0 and any(i.kind == "padding" for s in b.steps for i in s.items)
    assert b.steps == a.steps and b.requests == a.requests and b.to_dict() == a.to_dict()


def test_same_timeline_speculation():
    # no fast path there (speculation draws acceptances): unchanged
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    assert same_run("chunked", speculative_config=spec, acceptance=0.7, max_num_seqs=8) == 0


def test_same_timeline_lpm_and_stop_tokens():
    same_run("continuous", scheduling_policy="lpm", max_num_seqs=8)
    # a stop id that never comes: every decode goes through the stop rules
    assert same_run("chunked", sampling={"stop_token_ids": (5,)}, max_num_seqs=8) > 0


def test_bulk_steps_run_beside_prompts():
    fast, _ = run(True, "chunked", max_num_seqs=8)
    assert fast.bulk_steps > 0 and fast.fast_steps > 0
    assert fast.bulk_steps + fast.fast_steps < len(fast.timeline.steps)  # the rest: the scheduler's


def test_summarize_makes_no_decode_items():
    # a fast step keeps its decodes as ids and contexts; summarize counts them without the list
    fast, tl = run(True, "chunked", max_num_seqs=8)
    compact = [s for s in tl.steps if isinstance(s, DecodeStep)]
    assert len(compact) == fast.bulk_steps + fast.fast_steps
    summarize(tl)
    assert not any("items" in vars(s) for s in compact)
    for s in compact:  # made when read: n one-token decodes, then rest, as bulk_decodes says
        n, rest = s.bulk_decodes()
        assert n > 0 and s.items[n:] == rest
        assert all(i.kind == "decode" and i.num_tokens == 1 for i in s.items[:n])
    plain = next(s for s in tl.steps if not isinstance(s, DecodeStep))
    assert plain.bulk_decodes() == (0, plain.items)


def test_a_dropped_engine_goes_at_once():
    # the lanes hold their engine weakly: no cycle, so the engine and its requests are freed
    # when dropped, not in whatever code the next cyclic collection interrupts
    fast, _ = run(True, "chunked", max_num_seqs=8)
    assert fast.lanes is not None  # the fast path ran
    gone = weakref.ref(fast)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del fast
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_same_timeline_reserved_kv(policy):
    # reserved KV holds each request's longest length up front: a lane at a block's start
    # takes no fresh block there (its table is never full)
    assert same_run(policy, kv_mode="reserved", max_num_seqs=8) > 0


def test_lanes_are_never_the_preemption_victim():
    # a long prompt, admitted first, is chunked (64 tokens a step) while four newer requests
    # decode as lanes; when its chunk finds no free block, the scheduler's step preempts the
    # newest running request not yet scheduled: never a decode (the lanes count as scheduled)
    def go(fast: bool):
        knobs = dict(max_num_seqs=8, num_blocks=40, long_prefill_token_threshold=64)
        engine = simulated_engine("llama-3-8b", "h100", "chunked", fast_forward=fast, **knobs)
        long = [RequestSpec("long", list(range(600)), 4, 0.0)]
        short = [RequestSpec(f"s{i}", list(range(16)), 200, 0.001 * (i + 1)) for i in range(4)]
        engine.add_workload(long + short)
        return engine.run()

    a, b = go(False), go(True)
    assert any(isinstance(s, DecodeStep) and s.num_preempted for s in b.steps)
    assert b.steps == a.steps and b.requests == a.requests


def test_pending_in_arrival_order_when_given_out_of_order():
    # Scheduler.add appends an arrival in order and searches only for one that is not
    arrivals = [0.3, 0.1, 0.2, 0.1, 0.5, 0.0, 0.5]
    specs = [RequestSpec(f"r{i}", [1, 2, 3], 4, a) for i, a in enumerate(arrivals)]
    engine = simulated_engine("llama-3-8b", "h100", "chunked")
    engine.add_workload(specs)
    pending = [r.request_id for r in engine.scheduler.pending]
    assert pending == ["r5", "r1", "r3", "r2", "r0", "r4", "r6"]  # ties: in the order given


def test_same_timeline_with_a_pool_of_your_own():
    # lanes take their fresh blocks from the manager's pool; a pool of your own (exercise 4)
    # is asked one block a lane, as schedule_running asks it, and gives the same run
    asked = []

    class OwnPool(BlockPool):
        def get_new_blocks(self, n: int) -> list[int]:
            asked.append(n)
            return super().get_new_blocks(n)

    def go(fast: bool, block_pool=None):
        cost = CostModel("llama-3-8b", "h100")
        executor = SimulatedExecutor(cost)
        config = EngineConfig(policy="chunked", max_num_seqs=8, dtype=cost.dtype)
        clock = SimulatedClock(executor.step_time)
        engine = SimulatedEngine(executor, config, clock=clock, block_pool=block_pool)
        engine.fast = fast
        vocab = engine.model_config.vocab_size
        engine.add_workload(make_workload("mixed", 40, seed=3, vocab_size=vocab, rate=40.0))
        return engine, engine.run()

    _, a = go(False)
    fast, b = go(True, OwnPool)
    assert fast.fast_steps + fast.bulk_steps > 0 and 1 in asked
    assert b.steps == a.steps and b.requests == a.requests
