"""Invariants of the scheduler and the KV cache manager over random workloads and knobs.

The model is irrelevant to these properties, so a trivial executor stands in for it:
this is the real scheduler, KV cache manager and engine loop, only without matrix math.
The KV figures' properties run on the simulator, which also speculates.
"""

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from minilm import Engine, EngineConfig, summarize
from minilm.config import ModelConfig
from minilm.core.clock import SimulatedClock
from minilm.metrics import kv_unused_slots
from minilm.plan import ModelOutput, StepPlan
from minilm.sim import simulated_engine

CFG = ModelConfig(
    vocab_size=50,
    hidden_size=8,
    intermediate_size=8,
    num_hidden_layers=1,
    num_attention_heads=1,
    num_key_value_heads=1,
    eos_token_id=7,
)


class CountingExecutor:
    """Samples token 1 for every sequence that samples (EOS 7 only where asked)."""

    kind, speculates = "counting", False
    model_config = CFG

    def __init__(self, eos_every: int):
        self.eos_every, self.calls = eos_every, 0

    def describe(self) -> dict:
        return {"model": "counting"}

    def forget(self, request_id: str) -> None:
        pass

    def execute(self, plan: StepPlan) -> ModelOutput:
        self.calls += 1
        eos = self.eos_every and self.calls % self.eos_every == 0
        return ModelOutput({w.request_id: [7 if eos else 1] for w in plan.work if w.samples})


def check_kv_cache(e: Engine) -> None:
    kv = e.kv_manager
    owned = [b for t in kv.block_tables.values() for b in t]
    assert len(owned) == len(set(owned)), "a block is held by two requests"
    assert not set(owned) & set(kv.pool.free), "a block is both free and held"
    assert len(owned) + kv.num_free_blocks == kv.num_blocks, "free + used != total"
    live = {r.request_id for r in e.scheduler.running}
    held = {
        r.request_id for r in getattr(e.policy, "batch", [])
    }  # rows of a static batch that is still running
    assert set(kv.block_tables) <= live | held, "a finished or waiting request still holds blocks"


requests = st.lists(
    st.tuples(st.integers(1, 60), st.integers(1, 30), st.floats(0, 0.05)), min_size=1, max_size=14
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=requests,
    policy=st.sampled_from(["static", "continuous", "chunked"]),
    max_num_seqs=st.integers(1, 6),
    block_size=st.sampled_from([1, 2, 4, 16]),
    extra_budget=st.integers(0, 60),
    extra_blocks=st.integers(0, 20),
    eos_every=st.integers(0, 5),
    kv_mode=st.sampled_from(["paged", "reserved"]),
)
def test_every_request_finishes_exactly_once(
    reqs, policy, max_num_seqs, block_size, extra_budget, extra_blocks, eos_every, kv_mode
):
    max_len = max(p + m for p, m, _ in reqs)
    num_blocks = -(-max_len // block_size) + extra_blocks  # the longest request always fits alone
    budget = max_num_seqs + extra_budget  # a step has room for a decode of every running request
    if policy == "continuous":
        budget = max(budget, max_len)
    cfg = EngineConfig(
        policy=policy,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_model_len=128,
        kv_mode=kv_mode,
    )
    e = Engine(CountingExecutor(eos_every), cfg, clock=SimulatedClock(lambda plan: 0.001))
    for i, (p, m, t) in enumerate(reqs):
        e.add_request(f"r{i}", [3] * p, max_tokens=m, arrival=t)
    finished_ids = []
    for _ in range(10_000):
        rec = e.step()
        if rec is None:
            break
        check_kv_cache(e)
        if policy == "chunked":
            assert rec.tokens() <= budget
        assert len({i.request_id for i in rec.items}) <= max_num_seqs
        finished_ids += [r.request_id for r in e.timeline.requests[len(finished_ids) :]]
    else:
        raise AssertionError("engine did not finish")
    assert sorted(finished_ids) == sorted(f"r{i}" for i in range(len(reqs))), (
        "lost or duplicated a request"
    )
    assert e.kv_manager.num_free_blocks == num_blocks, "blocks leaked"
    for r in e.timeline.requests:
        spec_p, spec_m, _ = reqs[int(r.request_id[1:])]
        ended_early = r.output_ids and r.output_ids[-1] == 7
        assert r.output_len == spec_m or (ended_early and r.output_len <= spec_m)
        assert r.finish_reason == ("stop" if ended_early else "length")
        assert len(r.token_times) == r.output_len
        assert r.t_finished >= r.t_first_token >= r.arrival


# ---- the KV figures of every step, with shared blocks and speculation ------------------------
def tokens_per_block(tl) -> list[int]:
    """Each step's tokens in the KV cache, from its block tables alone: every request holds its
    latest item's context (padding included), and a block shared by several tables counts once."""
    bs, context, out = tl.meta["block_size"], {}, []
    for s in tl.steps:
        for item in s.items:
            context[item.request_id] = item.context_len
        filled: dict[int, int] = {}
        for rid, table in s.kv_blocks.items():
            for j, block in enumerate(table):
                filled[block] = max(
                    filled.get(block, 0), min(bs, max(0, context.get(rid, 0) - j * bs))
                )
        out.append(sum(filled.values()))
    return out


prompt_parts = st.lists(
    st.lists(st.integers(1, 4), min_size=4, max_size=24), min_size=1, max_size=3
)
SPECULATION = {
    "off": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
    "draft_model": {"method": "draft_model", "model": "tiny", "num_speculative_tokens": 2},
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefixes=prompt_parts,
    data=st.data(),
    policy=st.sampled_from(["static", "continuous", "chunked"]),
    caching=st.booleans(),
    speculation=st.sampled_from(list(SPECULATION)),
    block_size=st.sampled_from([1, 2, 4]),
    max_num_seqs=st.integers(1, 5),
    extra_blocks=st.integers(0, 12),
    kv_mode=st.sampled_from(["paged", "reserved"]),
)
def test_kv_figures_stay_within_the_cache(
    prefixes, data, policy, caching, speculation, block_size, max_num_seqs, extra_blocks, kv_mode
):
    """Every step: 0 <= tokens held (each shared block's once) <= slots allocated (blocks held by
    some request, a shared one once) <= slots in the cache; unused = allocated - held >= 0; the
    tokens held are those its block tables and items say; the free blocks that keep a cached
    prefix are not among those held."""
    reqs = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, len(prefixes) - 1),
                st.lists(st.integers(1, 4), max_size=6),
                st.integers(1, 10),
                st.floats(0, 0.02),
            ),
            min_size=2,
            max_size=8,
        )
    )
    prompts = [prefixes[p] + tail for p, tail, _, _ in reqs]
    spec = SPECULATION[speculation]
    max_len = (
        max(len(p) + m for p, (_, _, m, _) in zip(prompts, reqs)) + 3
    )  # room for a draft model's lookahead
    e = simulated_engine(
        "tiny",
        "cpu",
        policy=policy,
        enable_prefix_caching=caching,
        block_size=block_size,
        num_blocks=-(-max_len // block_size) + extra_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=None if policy == "static" else max(max_len, max_num_seqs),
        max_model_len=128,
        kv_mode=kv_mode,
        speculative_config=spec,
        acceptance=None if spec is None else 0.6,
    )
    for i, (prompt, (_, _, m, t)) in enumerate(zip(prompts, reqs)):
        e.add_request(f"r{i}", prompt, max_tokens=m, arrival=t)
    tl = e.run()
    total = e.kv_manager.num_blocks * block_size
    for s, held_by_tables in zip(tl.steps, tokens_per_block(tl)):
        allocated, held, unused = (
            s.kv_blocks_used * block_size,
            s.kv_tokens_stored,
            kv_unused_slots(s, block_size),
        )
        assert 0 <= held <= allocated <= total and 0 <= unused <= allocated, (
            s.step,
            held,
            unused,
            allocated,
        )
        assert held + unused == allocated
        assert held == held_by_tables, (
            f"step {s.step}: {held} tokens held, the block tables say {held_by_tables}"
        )
        in_tables = {b for table in s.kv_blocks.values() for b in table}
        assert len(in_tables) == s.kv_blocks_used, "a shared block counts once"
        assert not in_tables & set(s.kv_cached_free or []), "a cached free block is held"
    m = summarize(tl)
    assert 0 <= m["kv_unused_slots_mean"] <= total and m["peak_kv_blocks"] <= m["kv_blocks_total"]
    event(f"hits: {any(r.num_cached_tokens for r in tl.requests)}")


def test_a_static_batch_s_dead_rows_hold_their_kv():
    """With speculation a static batch's row can end, and finish its padding, while others still
    decode: it computes nothing in those steps, yet its blocks hold its tokens and padding."""
    e = simulated_engine(
        "tiny",
        "cpu",
        policy="static",
        block_size=4,
        num_blocks=64,
        max_num_seqs=4,
        speculative_config=SPECULATION["ngram"],
        acceptance=0.5,
    )
    for i in range(4):
        e.add_request(f"r{i}", [1 + i, 2, 3, 4, 1, 2, 3, 4], max_tokens=19)
    tl = e.run()
    idle = [s.step for s in tl.steps if set(s.kv_blocks) - {i.request_id for i in s.items}]
    assert idle, "no step with a dead row that computes nothing"
    assert [s.kv_tokens_stored for s in tl.steps] == tokens_per_block(tl)
