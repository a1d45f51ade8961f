"""Speculative decoding in the simulator (minilm/sim/speculative.py, lesson 10): acceptance from
a model (i.i.d. alpha, seeded) or replayed from a measured run, the verification and the draft
model priced by the cost model, and the batch size where speculation stops paying."""

from __future__ import annotations

import json
import math

import pytest
from helpers import micro_model

from minilm import Engine, EngineConfig
from minilm.cli import main
from minilm.config import InvalidValue
from minilm.core.clock import SimulatedClock
from minilm.metrics import summarize
from minilm.sim import CostModel, SimulatedExecutor, simulated_engine
from minilm.sim.spec_speedup import spec_speedup_table
from minilm.sim.speculative import acceptance_trace, expected_acceptance_length
from minilm.timeline import Timeline
from minilm.workload import RequestSpec

K = 4
DRAFT = {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": K}
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}


def sim_run(
    spec=None, acceptance=None, num_requests=4, prompt_len=32, max_tokens=64, **knobs
) -> Engine:
    e = simulated_engine(
        "llama-3-8b",
        "h100",
        speculative_config=spec,
        acceptance=acceptance,
        max_num_seqs=knobs.pop("max_num_seqs", 8),
        max_model_len=4096,
        **knobs,
    )
    e.add_workload(
        [RequestSpec(f"r{i}", [7 + i] * prompt_len, max_tokens) for i in range(num_requests)]
    )
    e.run()
    return e


def decodes(tl: Timeline):
    return [i for s in tl.steps for i in s.items if i.kind == "decode"]


def test_a_simulated_speculative_run_is_reproducible_bit_for_bit():
    runs = [sim_run(DRAFT, 0.7).timeline.to_json() for _ in range(2)]
    assert runs[0] == runs[1]
    assert (
        sim_run(DRAFT, 0.7, seed=1).timeline.to_json() != runs[0]
    )  # the seed draws the acceptances


@pytest.mark.parametrize("spec", [DRAFT, NGRAM])
def test_alpha_0_rejects_every_draft_and_only_costs_more(spec):
    off, on = sim_run(), sim_run(spec, 0.0)
    items = decodes(on.timeline)
    assert sum(i.num_draft for i in items) > 0 and all(i.num_accepted == 0 for i in items)
    assert [r.output_len for r in on.timeline.requests] == [
        r.output_len for r in off.timeline.requests
    ]
    assert len(on.timeline.steps) == len(off.timeline.steps)  # one token a step, as without drafts
    for a, b in zip(
        off.timeline.steps, on.timeline.steps
    ):  # the target's part: more with drafts to verify
        target = b.duration - b.draft_time
        assert (
            target > a.duration
            if any(i.num_draft for i in b.items)
            else target == pytest.approx(a.duration)
        )
    draft_times = [s.draft_time for s in on.timeline.steps]
    # drafting: every step but the last two (no draft could be kept there); n-gram lookup is free
    assert all(t > 0 for t in draft_times[:-2]) if spec is DRAFT else not any(draft_times)


def test_alpha_1_keeps_every_draft_and_takes_k_plus_1_times_fewer_steps():
    max_tokens = 101
    on = sim_run(DRAFT, 1.0, max_tokens=max_tokens)
    assert all(i.num_accepted == i.num_draft for i in decodes(on.timeline))
    per_request = len(decodes(on.timeline)) // 4
    assert per_request == math.ceil(
        (max_tokens - 1) / (K + 1)
    )  # the prefill's token, then k + 1 a step
    assert len(decodes(sim_run(max_tokens=max_tokens).timeline)) // 4 == max_tokens - 1
    assert all(r.output_len == max_tokens for r in on.timeline.requests)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_mean_acceptance_length_is_the_iid_models(alpha):
    """Verifications of k drafts keep 1 + a tokens, a ~ P(a = j) = alpha^j (1 - alpha) for j < k,
    alpha^k for j = k. The mean of n of them lies within 4.5 standard errors of (1 - alpha^(k+1)) /
    (1 - alpha) except with probability 7e-6 (normal approximation, n > 3,000); the seed is fixed, so
    the test is deterministic. Decodes capped by a request's end (fewer than k drafts) are left out."""
    e = sim_run(DRAFT, alpha, num_requests=16, max_tokens=1000, max_num_seqs=16)
    kept = [1 + i.num_accepted for i in decodes(e.timeline) if i.num_draft == K]
    p = [alpha**j * (1 - alpha) for j in range(K)] + [alpha**K]
    mean = sum((1 + j) * pj for j, pj in enumerate(p))
    sd = math.sqrt(sum((1 + j - mean) ** 2 * pj for j, pj in enumerate(p)))
    assert mean == pytest.approx(expected_acceptance_length(alpha, K), rel=1e-12)
    assert len(kept) > 3000
    assert abs(sum(kept) / len(kept) - mean) < 4.5 * sd / math.sqrt(len(kept))


def test_a_measured_runs_acceptance_replays_exactly():
    """A real micro-model run with n-gram lookup; its decodes' (drafts, accepted) replayed in a long
    simulated request come back in order, cycle after cycle, with the same acceptance rate."""
    measured = Engine(
        micro_model(0),
        EngineConfig(speculative_config=NGRAM, max_model_len=128),
        clock=SimulatedClock(lambda plan: 0.001),
    )
    for i, p in enumerate(
        [[5, 6, 7, 8] * 3, list(range(10, 40)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [9] * 20]
    ):
        measured.add_request(f"r{i}", p, max_tokens=60, ignore_eos=True)
    tl = measured.run()
    trace = acceptance_trace(tl)
    drafts, accepted = sum(d for d, _ in trace), sum(a for _, a in trace)
    assert 0 < accepted < drafts and any(
        d == 0 for d, _ in trace
    )  # kept, rejected, and n-gram misses
    e = simulated_engine("llama-3-8b", "h100", speculative_config=NGRAM, acceptance=tl)
    e.add_request("long", [7] * 16, max_tokens=4 * len(trace) * (K + 1))
    replayed = [(i.num_draft, i.num_accepted) for i in decodes(e.run())]
    assert replayed[: 3 * len(trace)] == trace * 3
    rate = sum(a for _, a in replayed[: 3 * len(trace)]) / sum(
        d for d, _ in replayed[: 3 * len(trace)]
    )
    assert rate == accepted / drafts
    # the measured run's own rate also counts the decodes capped at its requests' ends
    assert summarize(e.timeline)["spec_acceptance_rate"] == pytest.approx(
        summarize(tl)["spec_acceptance_rate"], rel=0.1
    )
    assert acceptance_trace(e.timeline)  # a simulated run with speculation replays too


def test_the_draft_model_is_priced_as_it_runs():
    """spec_decode/draft_model.py's work: the first proposal runs the whole sequence (prompt and first
    token) and then k - 1 one-token steps; later ones catch up on the tokens the target kept. The
    target's part of every step is what the cost model says for its items."""
    e = sim_run(DRAFT, 0.7, num_requests=1, prompt_len=100, max_tokens=40)
    draft, target = e.executor.speculation.draft, e.executor.cost
    first, second = e.timeline.steps[:2]
    assert first.draft_time == pytest.approx(
        draft.cost([(101, 101)]).time + sum(draft.cost([(1, 101 + i)]).time for i in range(1, K))
    )
    kept = 1 + second.items[0].num_accepted
    length = 101 + kept
    assert second.draft_time == pytest.approx(
        draft.cost([(kept, length)]).time
        + sum(draft.cost([(1, length + i)]).time for i in range(1, K))
    )
    for s in e.timeline.steps:
        assert s.duration == pytest.approx(target.items_time(s.items) + s.draft_time, rel=1e-12)
        assert s.model_time == pytest.approx(s.duration, rel=1e-12)


def test_a_verifying_step_computes_logits_at_every_draft():
    cm = CostModel("llama-3-8b", "h100")
    extra = cm.cost([(5, 100)], num_drafts=4).linear_flops - cm.cost([(5, 100)]).linear_flops
    assert extra == 2 * 4 * cm.model.hidden_size * cm.model.vocab_size


def test_a_draft_forward_pays_no_step_overhead():
    draft = sim_run(DRAFT, 0.5, num_requests=1).executor.speculation.draft
    assert (
        draft.cost([(1, 10)]).overhead_s
        == 0.0
        < CostModel("llama-3.2-1b", "h100").cost([(1, 10)]).overhead_s
    )


def test_the_draft_model_takes_memory_from_the_kv_cache():
    off, on = sim_run(num_requests=1), sim_run(DRAFT, 0.7, num_requests=1)
    cost, draft = on.executor.cost, on.executor.speculation.draft
    per_block = 16 * (cost.kv_bytes_per_token + draft.kv_bytes_per_token)
    free = cost.kv_cache_bytes(0.9) - draft.model.num_params * 2
    assert on.config.num_blocks == free // per_block < off.config.num_blocks
    assert sim_run(NGRAM, 0.7, num_requests=1).config.num_blocks == off.config.num_blocks


def test_speculation_pays_at_batch_1_and_costs_at_a_large_batch():
    """Llama-3-8B on an H100 with Llama-3.2-1B drafting k=4, alpha=0.7 (simulated): at batch 1 the
    step is memory-bound and verifying drafts is nearly free; at batch 256 it is compute-bound."""
    small, large = spec_speedup_table(
        "llama-3-8b",
        "h100",
        "llama-3.2-1b",
        k=4,
        acceptance=0.7,
        batch_sizes=(1, 256),
        max_tokens=128,
    )
    assert small["speedup"] > 1.5 and large["speedup"] < 1
    assert small["tpot_ms_on"] < small["tpot_ms_off"] and large["tpot_ms_on"] > large["tpot_ms_off"]


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("acceptance", [-0.1, 1.5, float("nan"), "0.7", True, [0.7]])
def test_bad_acceptance_is_refused(acceptance):
    with pytest.raises(InvalidValue) as err:
        simulated_engine("llama-3-8b", "h100", speculative_config=DRAFT, acceptance=acceptance)
    assert err.value.name == "acceptance"


def test_a_trace_without_drafts_is_refused():
    no_spec = sim_run().timeline
    with pytest.raises(InvalidValue, match="no speculative_config"):
        simulated_engine("llama-3-8b", "h100", speculative_config=NGRAM, acceptance=no_spec)
    never_kept = sim_run(NGRAM, 0.5, max_tokens=2).timeline  # max_tokens 2: never a draft to verify
    with pytest.raises(InvalidValue, match="no drafts"):
        simulated_engine("llama-3-8b", "h100", speculative_config=NGRAM, acceptance=never_kept)


@pytest.mark.parametrize(
    "spec, acceptance, name",
    [
        (DRAFT, None, "acceptance"),
        (None, 0.7, "acceptance"),
        ({**DRAFT, "model": "no-such-draft"}, 0.7, "speculative_config.model"),
        ({**DRAFT, "model": "llama-2-7b"}, 0.7, "speculative_config.model"),  # Llama 2's vocabulary
        ({**DRAFT, "num_speculative_tokens": 0}, 0.7, "speculative_config.num_speculative_tokens"),
    ],
)
def test_bad_simulated_speculation_is_refused(spec, acceptance, name):
    with pytest.raises(InvalidValue) as err:
        simulated_engine("llama-3-8b", "h100", speculative_config=spec, acceptance=acceptance)
    assert err.value.name == name


def test_a_simulated_executor_without_speculation_refuses_a_speculative_config():
    with pytest.raises(InvalidValue, match="cannot speculate"):
        Engine(
            SimulatedExecutor(CostModel("llama-3-8b", "h100")),
            EngineConfig(speculative_config=NGRAM),
        )


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_every_policy_speculates_through_preemption_and_prefix_caching(policy):
    """A KV cache too small for every request at its longest, so requests are preempted, some
    holding drafts: every request still ends with its max_tokens, and no block leaks."""
    knobs = dict(
        policy=policy, num_blocks=40, block_size=16, enable_prefix_caching=policy != "static"
    )
    e = sim_run(DRAFT, 0.8, num_requests=6, prompt_len=100, max_tokens=120, **knobs)
    assert sum(r.preemptions for r in e.timeline.requests) > 0 or policy == "static"
    assert sorted(r.output_len for r in e.timeline.requests) == [120] * 6
    assert e.kv_manager.num_used_blocks == 0 or knobs["enable_prefix_caching"]
    assert not e.executor.speculation.draft_seen  # forgotten when finished or preempted
    assert sum(i.num_accepted for i in decodes(e.timeline)) > 0


# ---- command line -------------------------------------------------------------------------------
def test_cli_simulates_speculation_from_an_alpha_or_a_timeline(capsys, tmp_path):
    common = [
        "run",
        "--simulate",
        "--model",
        "llama-3-8b",
        "--device",
        "h100",
        "--policy",
        "continuous",
        "--num-requests",
        "8",
        "--ignore-eos",
        "--speculative-config",
        json.dumps(DRAFT),
        "--json",
    ]
    assert main([*common, "--acceptance", "0.7"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["spec_draft_tokens"] > 0 and summary["clock"] == "simulated"
    path = tmp_path / "measured.json"
    sim_run(NGRAM, 0.5).timeline.to_json(path)
    assert main([*common, "--acceptance", str(path)]) == 0
    capsys.readouterr()
    real = [
        "run",
        "--model",
        "tiny",
        "--num-requests",
        "2",
        "--speculative-config",
        json.dumps(NGRAM),
    ]
    assert (
        main([*real, "--acceptance", "0.7"]) == 2
    )  # a real model's drafts are kept or not by the model
    assert "only with --simulate" in capsys.readouterr().err
