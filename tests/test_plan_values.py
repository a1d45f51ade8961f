"""Only values cross the engine's step (docs/DESIGN.md, "One step"; issue 25.1): every plan is
encoded to bytes and decoded again before the executor sees it, as between two processes, and
the greedy outputs are token-identical to those of the same engine handed its plans directly,
under every policy, with prefix caching on and off, speculation off and with both proposers,
with preemptions (a tiny KV cache) and an abort. The executor keeps its own copy of each
request (model/runner.py CachedRequest), so nothing it needs can come from a live object.
"""

from __future__ import annotations

import msgspec
import pytest
from helpers import micro_model

from minilm import Engine, EngineConfig
from minilm.core.clock import SimulatedClock
from minilm.plan import StepPlan
from training.checkpoint import save_checkpoint

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
PROMPTS = [[5, 6, 7, 8] * 3, list(range(10, 30)), [3, 1, 4, 1, 5] * 2, [9] * 14, [5, 6, 7, 8] * 4]


class ThroughBytes:
    """An executor that is handed each plan as bytes (msgpack) decoded into a fresh StepPlan."""

    def __init__(self, executor):
        self.executor, self.plans = executor, 0
        self.kind, self.model_config = executor.kind, executor.model_config
        self.speculates = executor.speculates

    def execute(self, plan: StepPlan):
        copy = msgspec.msgpack.decode(msgspec.msgpack.encode(plan), type=StepPlan)
        assert copy == plan and copy is not plan
        self.plans += 1
        return self.executor.execute(copy)

    def forget(self, request_id: str) -> None:
        self.executor.forget(request_id)

    def describe(self) -> dict:
        return self.executor.describe()


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    path = save_checkpoint(micro_model(seed=1), tmp_path_factory.mktemp("draft") / "micro-draft")
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": 3}


def run(through_bytes: bool, abort_at: int | None = None, **knobs) -> dict:
    """Every request's output (and finish reason) of one engine over PROMPTS."""
    knobs = {"max_model_len": 96, "block_size": 4, **knobs}
    e = Engine(micro_model(0), EngineConfig(**knobs), clock=SimulatedClock(lambda plan: 1e-3))
    if through_bytes:
        e.executor = ThroughBytes(e.executor)
    for i, p in enumerate(PROMPTS):
        e.add_request(f"r{i}", p, max_tokens=20, ignore_eos=True, arrival=0.01 * i)
    steps = 0
    while e.step() is not None:
        steps += 1
        if steps == abort_at:
            assert e.abort("r1")
    assert not through_bytes or e.executor.plans == steps
    out = {r.request_id: (r.finish_reason, r.output_ids) for r in e.timeline.requests}
    return out | {"preempted": sum(s.num_preempted for s in e.timeline.steps)}


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("speculation", [None, "ngram", "draft_model"])
def test_plans_through_bytes_give_the_same_tokens(policy, caching, speculation, draft):
    spec = {"ngram": NGRAM, "draft_model": draft}.get(speculation)
    knobs = dict(policy=policy, enable_prefix_caching=caching, speculative_config=spec)
    if policy == "chunked":
        knobs["max_num_batched_tokens"] = 16  # prompts cut into chunks
    assert run(True, **knobs) == run(False, **knobs)


@pytest.mark.parametrize("speculation", [None, "ngram", "draft_model"])
def test_preemptions_and_an_abort_through_bytes(speculation, draft):
    spec = {"ngram": NGRAM, "draft_model": draft}.get(speculation)
    knobs = dict(policy="chunked", num_blocks=14, max_num_batched_tokens=16, abort_at=6)
    knobs |= dict(speculative_config=spec, enable_prefix_caching=True)
    direct = run(False, **knobs)
    assert run(True, **knobs) == direct
    assert direct.pop("preempted") > 0
    assert [reason for reason, _ in direct.values()].count("aborted") == 1
