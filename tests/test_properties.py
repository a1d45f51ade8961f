"""Invariants of the scheduler and the KV cache manager over random workloads and knobs.

The model is irrelevant to these properties, so a trivial executor stands in for it:
this is the real scheduler, KV cache manager and engine loop, only without matrix math.
"""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilm import Engine, EngineConfig
from minilm.core.clock import SimulatedClock
from minilm.config import ModelConfig
from minilm.plan import ModelOutput, StepPlan

CFG = ModelConfig(vocab_size=50, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=1, num_key_value_heads=1, eos_token_id=7)


class CountingExecutor:
    """Samples token 1 for every sequence that samples (EOS 7 only where asked)."""

    kind = "counting"
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
        return ModelOutput({w.request.request_id: [7 if eos else 1] for w in plan.work if w.samples})


def check_kv_cache(e: Engine) -> None:
    kv = e.kv_manager
    owned = [b for t in kv.block_tables.values() for b in t]
    assert len(owned) == len(set(owned)), "a block is held by two requests"
    assert not set(owned) & set(kv.pool.free), "a block is both free and held"
    assert len(owned) + kv.num_free_blocks == kv.num_blocks, "free + used != total"
    live = {r.request_id for r in e.scheduler.running}
    held = {r.request_id for r in getattr(e.policy, "batch", [])}  # rows of a static batch that is still running
    assert set(kv.block_tables) <= live | held, "a finished or waiting request still holds blocks"


requests = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30), st.floats(0, 0.05)), min_size=1, max_size=14)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, policy=st.sampled_from(["static", "continuous", "chunked"]),
       max_num_seqs=st.integers(1, 6), block_size=st.sampled_from([1, 2, 4, 16]),
       extra_budget=st.integers(0, 60), extra_blocks=st.integers(0, 20), eos_every=st.integers(0, 5),
       kv_mode=st.sampled_from(["paged", "reserved"]))
def test_every_request_finishes_exactly_once(reqs, policy, max_num_seqs, block_size, extra_budget, extra_blocks,
                                             eos_every, kv_mode):
    max_len = max(p + m for p, m, _ in reqs)
    num_blocks = -(-max_len // block_size) + extra_blocks  # the longest request always fits alone
    budget = max_num_seqs + extra_budget  # a step has room for a decode of every running request
    if policy == "continuous":
        budget = max(budget, max_len)
    cfg = EngineConfig(policy=policy, max_num_seqs=max_num_seqs, block_size=block_size, num_blocks=num_blocks,
                       max_num_batched_tokens=budget, max_model_len=128, kv_mode=kv_mode)
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
        finished_ids += [r.request_id for r in e.timeline.requests[len(finished_ids):]]
    else:
        raise AssertionError("engine did not finish")
    assert sorted(finished_ids) == sorted(f"r{i}" for i in range(len(reqs))), "lost or duplicated a request"
    assert e.kv_manager.num_free_blocks == num_blocks, "blocks leaked"
    for r in e.timeline.requests:
        spec_p, spec_m, _ = reqs[int(r.request_id[1:])]
        ended_early = r.output_ids and r.output_ids[-1] == 7
        assert r.output_len == spec_m or (ended_early and r.output_len <= spec_m)
        assert r.finish_reason == ("stop" if ended_early else "length")
        assert len(r.token_times) == r.output_len
        assert r.t_finished >= r.t_first_token >= r.arrival
