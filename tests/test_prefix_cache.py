"""Automatic prefix caching: shared prefixes computed once, and nothing else changes.

A stand-in executor (as in test_properties.py) runs the real scheduler and KV cache
manager over random workloads with shared prefixes, random knobs and tight caches;
the real model checks that greedy outputs do not change with caching on or off.
"""

import random
from collections import Counter

import pytest
from helpers import MICRO, engine, micro_model
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_properties import CountingExecutor

from minilm import Engine, EngineConfig, RequestSpec, summarize
from minilm.core.clock import SimulatedClock
from minilm.sim import simulated_engine


def check_pool(e: Engine) -> None:
    kv, pool = e.kv_manager, e.kv_manager.pool
    holders = Counter(b for t in kv.block_tables.values() for b in t)
    for block in range(kv.num_blocks):
        assert pool.ref_cnt[block] == holders[block], (
            f"block {block}: refcount {pool.ref_cnt[block]}, held by {holders[block]} tables"
        )
        assert (block in pool.free) == (holders[block] == 0), (
            f"block {block} free and held, or neither"
        )
    for key, block in pool.cached.items():
        assert pool.key[block] == key
    _, cached_free = kv.snapshot()
    assert cached_free == sorted(b for b in pool.free if pool.key[b] is not None), (
        "the kept set drifted"
    )
    uncached_free = [b for b in pool.free if pool.key[b] is None]
    assert len(holders) + len(cached_free) + len(uncached_free) == kv.num_blocks, (
        "used + cached + free != total"
    )


prefixes = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefixes=prefixes,
    data=st.data(),
    policy=st.sampled_from(["static", "continuous", "chunked"]),
    max_num_seqs=st.integers(2, 6),
    block_size=st.sampled_from([1, 2, 4, 8]),
    extra_blocks=st.integers(0, 4),
    extra_budget=st.integers(0, 40),
    eos_every=st.integers(0, 4),
    kv_mode=st.sampled_from(["paged", "reserved"]),
    order=st.sampled_from(["fcfs", "lpm"]),
)
def test_refcounts_and_eviction_under_random_shared_prefixes(
    prefixes,
    data,
    policy,
    max_num_seqs,
    block_size,
    extra_blocks,
    extra_budget,
    eos_every,
    kv_mode,
    order,
):
    reqs = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, len(prefixes) - 1),
                st.lists(st.integers(0, 3), max_size=8),
                st.integers(1, 12),
                st.floats(0, 0.02),
            ),
            min_size=1,
            max_size=10,
        )
    )
    prompts = [prefixes[p] + tail for p, tail, _, _ in reqs]
    max_len = max(len(p) + m for p, (_, _, m, _) in zip(prompts, reqs))
    budget = max(max_num_seqs + extra_budget, max_len if policy == "continuous" else 0)
    cfg = EngineConfig(
        policy=policy,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        max_model_len=128,
        num_blocks=-(-max_len // block_size) + extra_blocks,
        max_num_batched_tokens=budget,
        kv_mode=kv_mode,
        enable_prefix_caching=True,
        scheduling_policy=order,
    )
    e = Engine(CountingExecutor(eos_every), cfg, clock=SimulatedClock(lambda plan: 0.001))
    for i, (prompt, (_, _, m, t)) in enumerate(zip(prompts, reqs)):
        e.add_request(f"r{i}", prompt, max_tokens=m, arrival=t)
    while e.step() is not None:
        check_pool(e)
        assert e.kv_manager.num_free_blocks >= 0
    assert sorted(r.request_id for r in e.timeline.requests) == sorted(
        f"r{i}" for i in range(len(reqs))
    )
    assert (
        not e.kv_manager.block_tables and e.kv_manager.num_free_blocks == e.kv_manager.num_blocks
    ), "every block free or cached at the end"
    for r in e.timeline.requests:
        assert r.num_cached_tokens % block_size == 0 and r.num_cached_tokens < r.prompt_len
    event(
        f"prefix hits: {any(r.num_cached_tokens for r in e.timeline.requests)}, "
        f"preempted: {any(r.preemptions for r in e.timeline.requests)}"
    )


def shared_prefix_specs(n=14, seed=0):
    rng = random.Random(seed)
    systems = [
        [rng.randrange(MICRO.vocab_size) for _ in range(rng.randrange(20, 45))] for _ in range(2)
    ]
    return [
        RequestSpec(
            f"r{i}",
            systems[i % 2] + [rng.randrange(MICRO.vocab_size) for _ in range(rng.randrange(1, 12))],
            max_tokens=rng.randrange(3, 12),
            arrival=0.001 * i,
        )
        for i in range(n)
    ]


def greedy(policy, caching, **knobs):
    e = engine(
        policy, model=micro_model(), max_model_len=128, enable_prefix_caching=caching, **knobs
    )
    e.add_workload(shared_prefix_specs(), ignore_eos=True)
    tl = e.run()
    return {r.request_id: r.output_ids for r in tl.requests}, tl


@pytest.mark.parametrize(
    "policy,knobs",
    [
        ("static", dict(max_num_seqs=4)),
        ("continuous", dict(max_num_seqs=6, block_size=4)),
        (
            "continuous",
            dict(max_num_seqs=6, block_size=4, num_blocks=20),
        ),  # tight: preemption and eviction
        ("chunked", dict(max_num_seqs=6, block_size=4, max_num_batched_tokens=16)),
        (
            "chunked",
            dict(
                max_num_seqs=6,
                block_size=8,
                max_num_batched_tokens=24,
                num_blocks=14,
                kv_mode="reserved",
            ),
        ),
    ],
)
def test_greedy_outputs_do_not_change_with_caching(policy, knobs):
    off, _ = greedy(policy, False, **knobs)
    on, tl = greedy(policy, True, **knobs)
    assert on == off
    assert summarize(tl)["prefix_cache_hit_rate"] > 0.3


def test_a_preempted_request_finds_its_own_blocks_again():
    _, tl = greedy("continuous", True, max_num_seqs=6, block_size=4, num_blocks=20)
    assert summarize(tl)["preemptions"] > 0
    readmitted = [
        i
        for s in tl.steps
        for i in s.items
        if i.kind == "cached"
        and next(r for r in tl.requests if r.request_id == i.request_id).preemptions
    ]
    assert readmitted, "a recomputed request reused cached blocks"


def test_the_last_prompt_token_is_always_recomputed():
    e = engine(
        "continuous",
        model=micro_model(),
        max_model_len=64,
        block_size=4,
        enable_prefix_caching=True,
    )
    e.add_request("a", list(range(1, 17)), max_tokens=2, ignore_eos=True)
    e.run()
    e.add_request(
        "b", list(range(1, 17)), max_tokens=2, ignore_eos=True
    )  # the same 16 tokens: 4 full blocks
    e.run()
    b = next(r for r in e.timeline.requests if r.request_id == "b")
    assert b.num_cached_tokens == 12, (
        "3 blocks reused; the 4th holds the last token, which must be computed"
    )
    a = next(r for r in e.timeline.requests if r.request_id == "a")
    assert b.output_ids == a.output_ids


def test_a_users_block_pool_cannot_cache():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        Engine(micro_model(), EngineConfig(enable_prefix_caching=True), block_pool=lambda n: None)
    with pytest.raises(ValueError, match="scheduling_policy='random'"):
        Engine(micro_model(), EngineConfig(scheduling_policy="random"))


# ---- a block's key names its whole prefix, not only its parent block -------------------------
BS = 4
P, P2, Q, R = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]
CHAIN = [
    ("a", P + Q + R + [17]),  # caches P, Q, R (its 4th block holds its last token)
    ("c", P2 + Q + [18]),  # caches P2, then Q after P2
    ("b", P2 + Q + R + [19]),
]  # P2 and Q hit c's blocks; R follows the same block Q as in a, but after P2


def run_chain(e: Engine) -> dict:
    """a and c run first (their blocks cached), then b; each request's record."""
    for rid, prompt in CHAIN[:2]:
        e.add_request(rid, prompt, max_tokens=6, ignore_eos=True)
    e.run()
    e.add_request(*CHAIN[2], max_tokens=6, ignore_eos=True)
    return {r.request_id: r for r in e.run().requests}


@pytest.mark.parametrize(
    "make",
    [
        lambda caching: engine(
            "continuous",
            model=micro_model(),
            max_model_len=64,
            block_size=BS,
            enable_prefix_caching=caching,
        ),
        lambda caching: simulated_engine(
            "tiny",
            "cpu",
            policy="continuous",
            block_size=BS,
            num_blocks=32,
            enable_prefix_caching=caching,
        ),
    ],
    ids=["model", "simulated"],
)
def test_a_block_hits_only_after_the_same_whole_prefix(make):
    """b's third block has the tokens of a's third block, after the same second block, but a
    different first one: its K/V differ, so b must not reuse a's (its key chains every block
    before it, vLLM's hash of the parent's hash and its own tokens, not only the parent's tokens)."""
    e = make(True)
    on, off = run_chain(e), run_chain(make(False))
    assert {rid: r.output_ids for rid, r in on.items()} == {
        rid: r.output_ids for rid, r in off.items()
    }
    assert on["c"].num_cached_tokens == 0 and on["b"].num_cached_tokens == 2 * BS, (
        "b reuses c's P2 and Q, not a's R"
    )
    a, b, c = (
        next(s.kv_blocks[rid] for s in e.timeline.steps if rid in s.kv_blocks) for rid in "abc"
    )
    assert b[:2] == c[:2] and a[2] not in b
