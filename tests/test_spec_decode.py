"""Speculative decoding (minilm/spec_decode/, lesson 10): greedy outputs unchanged, the sampled
distribution exactly the target's, the scheduler's books right after every rejection, and
bad configs refused before anything runs.

The engines here run the real micro model (tests/helpers.py); a draft model is a micro model
with other weights, written as a checkpoint (a draft is loaded by name or path, as a user gives it).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from helpers import MICRO, micro_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import check_kv_cache

from minilm import Engine, EngineConfig
from minilm.config import InvalidValue, ModelConfig
from minilm.core.clock import SimulatedClock
from minilm.model.sampling import accept, target_probs
from minilm.request import SamplingParams
from minilm.spec_decode import SpeculativeConfig
from minilm.spec_decode.ngram import prompt_lookup
from training.checkpoint import save_checkpoint
from training.dense import dense_logits

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """A draft model: the micro config with other random weights (it agrees with the target on some tokens)."""
    return str(
        save_checkpoint(micro_model(seed=1), tmp_path_factory.mktemp("draft") / "micro-draft")
    )


def draft_config(path: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": k}


def run(spec=None, policy="continuous", prompts=None, max_tokens=24, seed_model=0, **knobs):
    """A finished engine over a few prompts that repeat themselves (so n-gram lookup finds drafts)."""
    knobs.setdefault("max_model_len", 128)
    e = Engine(
        micro_model(seed_model),
        EngineConfig(policy=policy, speculative_config=spec, **knobs),
        clock=SimulatedClock(lambda plan: 0.001),
    )
    prompts = prompts or [
        [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
        list(range(10, 40)),
        [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
        [9] * 20,
    ]
    for i, p in enumerate(prompts):
        e.add_request(f"r{i}", p, max_tokens=max_tokens, ignore_eos=True)
    e.run()
    return e


def outputs(e: Engine) -> dict[str, list[int]]:
    return {r.request_id: r.output_ids for r in e.timeline.requests}


def spec_counts(e: Engine) -> tuple[int, int]:
    items = [i for s in e.timeline.steps for i in s.items]
    return sum(i.num_draft for i in items), sum(i.num_accepted for i in items)


# ---- greedy: token-identical with speculation on and off ----------------------------------------
@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_outputs_are_identical_with_speculation(policy, caching, method, draft_dir):
    spec = NGRAM if method == "ngram" else draft_config(draft_dir)
    knobs = dict(policy=policy, enable_prefix_caching=caching, block_size=4)
    if policy == "chunked":
        knobs["max_num_batched_tokens"] = (
            16  # prompts in chunks, and drafts that must share the budget
        )
    base, spec_run = run(None, **knobs), run(spec, **knobs)
    assert outputs(spec_run) == outputs(base)
    drafts, accepted = spec_counts(spec_run)
    assert 0 < accepted < drafts, "the run must both accept and reject drafts, or it proves little"
    decodes = [
        sum(i.kind == "decode" for s in r.timeline.steps for i in s.items) for r in (base, spec_run)
    ]
    assert (
        decodes[1] < decodes[0]
    )  # accepted drafts saved decode steps (a static batch still waits for its slowest row)
    assert spec_run.kv_manager.num_used_blocks == 0 or caching


def test_a_draft_that_is_the_target_has_every_draft_accepted(tmp_path):
    same = str(save_checkpoint(micro_model(seed=0), tmp_path / "same"))
    e = run(draft_config(same, k=3))
    drafts, accepted = spec_counts(e)
    assert drafts > 0 and accepted == drafts
    assert outputs(e) == outputs(run(None))


def test_the_draft_models_paged_proposals_are_its_dense_greedy_continuation(draft_dir):
    """Its own paged K/V, indexed by the target's block tables, caught up after rejections: every
    proposal must be what the draft model proposes from scratch (a dense forward, no cache)."""
    e = Engine(
        micro_model(0),
        EngineConfig(
            speculative_config=draft_config(draft_dir, k=3), block_size=4, max_model_len=128
        ),
        clock=SimulatedClock(lambda plan: 0.001),
    )
    proposer = e.executor.proposer
    checked = []
    real = proposer.propose

    def checked_propose(proposals):
        drafts = real(proposals)
        for p in proposals:
            ids = list(p.token_ids)
            for _ in range(p.num_drafts):
                ids.append(int(dense_logits(proposer.model, torch.tensor([ids]))[0, -1].argmax()))
            assert drafts[p.request_id] == ids[len(p.token_ids) :], p.request_id
            checked.append(p.request_id)
        return drafts

    proposer.propose = checked_propose
    for i, p in enumerate([[5, 6, 7, 8] * 3, list(range(20, 45)), [1, 2, 3]]):
        e.add_request(f"r{i}", p, max_tokens=20, ignore_eos=True)
    e.run()
    assert len(checked) > 20 and spec_counts(e)[1] < spec_counts(e)[0]


# ---- rejection sampling: the target's distribution, exactly -------------------------------------
def chi2_sf_even(x: float, df: int) -> float:
    """P(chi-square with an even `df` > x), exactly: exp(-x/2) * sum_{i < df/2} (x/2)^i / i!."""
    return math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(df // 2))


def chi2_p_value(counts: Counter, probs: torch.Tensor) -> float:
    n = sum(counts.values())
    stat = sum((counts.get(t, 0) - n * float(p)) ** 2 / (n * float(p)) for t, p in enumerate(probs))
    return chi2_sf_even(stat, len(probs) - 1)


V = 5  # a tiny vocabulary: df = 4, even, so the p-value above is exact
LOGITS = torch.tensor(
    [
        [1.0, 0.2, -0.5, 0.7, 0.0],  # after the last known token
        [0.1, 1.5, 0.3, -1.0, 0.4],
    ]
)  # after draft token 3, if it is kept
PARAMS = SamplingParams(temperature=0.8, seed=0)
N = 20_000


def draw(sampler, n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [sampler(LOGITS, [3], PARAMS, gen) for _ in range(n)]


def wrong_resample_from_p(logits, draft, params, gen):
    """Rejects with the right probability, then draws from p without removing the draft."""
    p = target_probs(logits[0], params)
    if torch.rand(1, generator=gen).item() < p[draft[0]]:
        return [draft[0], int(torch.multinomial(target_probs(logits[1], params), 1, generator=gen))]
    return [int(torch.multinomial(p, 1, generator=gen))]


def wrong_accept_with_ratio_to_uniform(logits, draft, params, gen):
    """Leviathan's rule with the wrong q: uniform instead of the one-hot the drafts come from."""
    p = target_probs(logits[0], params)
    if torch.rand(1, generator=gen).item() < min(1.0, float(p[draft[0]]) * V):
        return [draft[0], int(torch.multinomial(target_probs(logits[1], params), 1, generator=gen))]
    p[draft[0]] = 0
    return [int(torch.multinomial(p, 1, generator=gen))]


def distribution_checks(sampler, n: int = N) -> tuple[float, float]:
    """p-values of: the first kept token ~ p(. | context); the second, given the first was the
    draft, ~ p(. | context + draft)."""
    kept = draw(sampler, n)
    first = Counter(k[0] for k in kept)
    second = Counter(k[1] for k in kept if k[0] == 3 and len(k) > 1)
    return (
        chi2_p_value(first, target_probs(LOGITS[0], PARAMS)),
        chi2_p_value(second, target_probs(LOGITS[1], PARAMS)),
    )


def test_rejection_sampling_keeps_the_targets_distribution():
    """20,000 draws on a 5-token vocabulary, chi-square against the target's probabilities. For a
    correct sampler each p-value is uniform on [0, 1]: this test fails with probability 1e-6 per
    check (2e-6 in all) for a random seed; the seed is fixed, so it is deterministic. The same
    test rejects two plausible mistakes (below) with a fifth of the draws, so it has the power to see one."""
    for p in distribution_checks(accept):
        assert p > 1e-6, p
    for wrong in (wrong_resample_from_p, wrong_accept_with_ratio_to_uniform):
        assert min(distribution_checks(wrong, N // 5)) < 1e-6, wrong.__name__


def test_without_drafts_accept_is_one_plain_sample():
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = [accept(LOGITS[:1], [], PARAMS, gen_a)[0] for _ in range(50)]
    b = [
        int(torch.multinomial(target_probs(LOGITS[0], PARAMS), 1, generator=gen_b))
        for _ in range(50)
    ]
    assert a == b


def test_greedy_acceptance_keeps_the_agreeing_prefix_then_the_targets_token():
    logits = torch.full((4, V), -1.0)
    logits[0, 2] = logits[1, 4] = logits[2, 0] = logits[3, 1] = 1.0  # argmax: 2, 4, 0, 1
    greedy = SamplingParams()
    assert accept(logits, [2, 4, 0], greedy, None) == [2, 4, 0, 1]  # all kept, then the bonus token
    assert accept(logits, [2, 3, 0], greedy, None) == [2, 4]  # the second disagrees: the target's 4
    assert accept(logits, [1, 4, 0], greedy, None) == [2]


def test_sampling_with_speculation_is_reproducible_with_a_seed():
    spec = dict(NGRAM)
    runs = []
    for _ in range(2):
        e = Engine(micro_model(0), EngineConfig(speculative_config=spec, max_model_len=128))
        e.add_request(
            "a", [5, 6, 7, 8] * 3, max_tokens=30, temperature=1.0, seed=7, ignore_eos=True
        )
        e.run()
        runs.append(e.requests["a"].output_ids)
    assert runs[0] == runs[1] and len(runs[0]) == 30


# ---- the scheduler's books ------------------------------------------------------------------------
def test_drafts_share_the_token_budget_and_every_decode_keeps_its_token():
    """Budget 8 for 6 running requests with 4 drafts each: drafts take only what is left after one
    token for every other running request."""
    e = run(
        dict(NGRAM),
        policy="chunked",
        max_num_batched_tokens=8,
        max_num_seqs=6,
        prompts=[[5, 6, 7, 5, 6, 7]] * 6,
        max_tokens=16,
    )
    for s in e.timeline.steps:
        assert s.tokens() <= 8
        running_decodes = [i for i in s.items if i.kind == "decode"]
        assert len({i.request_id for i in running_decodes}) == len(running_decodes)
    assert sum(i.num_draft for s in e.timeline.steps for i in s.items) > 0


def test_computed_tokens_after_every_step_with_speculation(draft_dir):
    """After each step every running request that sampled has all but its last token computed
    (a rejected draft's slot does not count), holds KV for them, and its drafts fit its length."""
    for spec in (NGRAM, draft_config(draft_dir)):
        e = Engine(
            micro_model(0),
            EngineConfig(speculative_config=spec, block_size=4, max_model_len=128),
            clock=SimulatedClock(lambda plan: 0.001),
        )
        for i, p in enumerate([[5, 6, 7, 8] * 3, list(range(20, 45)), [1, 2, 3] * 4]):
            e.add_request(f"r{i}", p, max_tokens=25, ignore_eos=True)
        while (rec := e.step()) is not None:
            sampled = {i.request_id for i in rec.items if i.kind == "decode"}
            for req in e.scheduler.running:
                if req.request_id in sampled:
                    assert req.num_computed_tokens == req.num_tokens - 1
                assert len(e.kv_manager.block_tables[req.request_id]) * 4 >= req.num_computed_tokens
                assert len(req.output_ids) + len(req.spec_token_ids) < req.params.max_tokens
            for item in rec.items:
                assert 0 <= item.num_accepted <= item.num_draft
        for r in (
            e.timeline.requests
        ):  # every kept token is an accepted draft or one token of a sampling step
            kept = sum(
                1 + i.num_accepted
                for s in e.timeline.steps
                for i in s.items
                if i.request_id == r.request_id
                and (i.kind == "decode" or i.context_len == r.prompt_len)
            )
            assert kept == r.output_len == 25


def test_preemption_in_the_middle_of_a_speculation(draft_dir, monkeypatch):
    """A KV cache too small for every request: requests are preempted while they hold drafts;
    outputs stay the greedy ones, and no block leaks."""
    caught = []
    from minilm.core.step import StepBuilder

    real = StepBuilder._preempt

    def spy(self, req):
        caught.append(len(req.spec_token_ids))
        real(self, req)

    monkeypatch.setattr(StepBuilder, "_preempt", spy)
    prompts = [[5, 6, 7, 8] * 3, list(range(20, 32)), [1, 2, 3] * 4, [9, 8] * 6]
    knobs = dict(block_size=4, num_blocks=18, max_num_seqs=4, prompts=prompts, max_tokens=40)
    base = outputs(run(None, **knobs))
    for spec in (NGRAM, draft_config(draft_dir)):
        caught.clear()
        e = run(spec, **knobs)
        assert any(caught), "no request was preempted while it held drafts"
        assert outputs(e) == base
        assert e.kv_manager.num_free_blocks == 18


def test_abort_in_the_middle_of_a_speculation(draft_dir):
    e = Engine(
        micro_model(0), EngineConfig(speculative_config=draft_config(draft_dir), max_model_len=128)
    )
    for i in range(3):
        e.add_request(f"r{i}", [5, 6, 7, 8] * 3, max_tokens=30, ignore_eos=True)
    while not e.requests["r1"].spec_token_ids:
        e.step()
    assert e.abort("r1")
    assert "r1" not in e.executor.proposer.num_computed
    e.run()
    assert [r.finish_reason for r in e.timeline.requests].count("aborted") == 1
    assert e.kv_manager.num_used_blocks == 0


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    reqs=st.lists(
        st.tuples(
            st.lists(st.integers(0, 6), min_size=1, max_size=20),
            st.integers(1, 20),
            st.floats(0, 0.01),
        ),
        min_size=1,
        max_size=6,
    ),
    policy=st.sampled_from(["static", "continuous", "chunked"]),
    k=st.integers(1, 5),
    method=st.sampled_from(["ngram", "draft_model"]),
    block_size=st.sampled_from([1, 4, 16]),
    extra_blocks=st.integers(0, 8),
    caching=st.booleans(),
    budget=st.integers(4, 40),
)
def test_speculation_keeps_every_invariant(
    reqs, policy, k, method, block_size, extra_blocks, caching, budget, draft_dir
):
    """Random workloads and knobs, speculation on: every request finishes once with its greedy
    tokens, no block leaks, and the KV books hold after every step."""
    max_len = max(len(p) + m for p, m, _ in reqs)
    knobs = dict(
        policy=policy,
        block_size=block_size,
        num_blocks=-(-max_len // block_size) + extra_blocks,
        max_num_seqs=4,
        max_model_len=64,
        enable_prefix_caching=caching,
        max_num_batched_tokens=None
        if policy == "static"
        else max(budget, max_len if policy == "continuous" else 4),
    )
    spec = (
        {**NGRAM, "num_speculative_tokens": k} if method == "ngram" else draft_config(draft_dir, k)
    )
    results = []
    for s in (None, spec):
        e = Engine(
            micro_model(0),
            EngineConfig(speculative_config=s, **knobs),
            clock=SimulatedClock(lambda p: 0.001),
        )
        for i, (p, m, t) in enumerate(reqs):
            e.add_request(f"r{i}", p, max_tokens=m, arrival=t, ignore_eos=True)
        while e.step() is not None:
            if not caching:
                check_kv_cache(e)
        assert sorted(r.request_id for r in e.timeline.requests) == sorted(
            f"r{i}" for i in range(len(reqs))
        )
        assert e.kv_manager.num_free_blocks == knobs["num_blocks"]
        assert all(r.output_len == reqs[int(r.request_id[1:])][1] for r in e.timeline.requests)
        results.append(outputs(e))
    assert results[0] == results[1]


# ---- n-gram lookup ----------------------------------------------------------------------------
def test_prompt_lookup_takes_the_longest_suffix_and_its_earliest_occurrence():
    # vLLM's example: [4, 2, 3] never occurred; [2, 3] did, followed by [4, 2, 3]
    assert prompt_lookup([1, 2, 3, 4, 2, 3], k=4, min_n=2, max_n=3) == [4, 2, 3]
    assert prompt_lookup([7, 1, 2, 9, 1, 2, 8, 1, 2], k=1, min_n=1, max_n=2) == [
        9
    ]  # earliest, not latest
    assert prompt_lookup([5, 1, 2, 9, 0, 2, 8, 1, 2], k=2, min_n=1, max_n=2) == [
        9,
        0,
    ]  # [1, 2] beats [2]
    assert prompt_lookup([1, 2, 3], k=4, min_n=1, max_n=3) == []
    assert prompt_lookup([1, 2, 1], k=4, min_n=2, max_n=3) == []  # only a 1-gram matches: below min
    assert prompt_lookup([3], k=4, min_n=1, max_n=3) == []


# ---- bad configs: a clear error before anything runs --------------------------------------------------
@pytest.mark.parametrize(
    "spec, name",
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "medusa"}, "method"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"method": "ngram", "prompt_lookup_max": 0}, "prompt_lookup_max"),
        ({"method": "ngram", "model": "docstrings-draft"}, "model"),
        ({"method": "draft_model"}, "model"),
        ({"method": "ngram", "num_spec_tokens": 4}, "speculative_config"),
        ("ngram", "speculative_config"),
    ],
)
def test_bad_speculative_configs_are_refused(spec, name):
    with pytest.raises(InvalidValue) as err:
        Engine(micro_model(0), EngineConfig(speculative_config=spec))
    assert err.value.name.endswith(name)


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path):
    other = ModelConfig(**{**MICRO.__dict__, "vocab_size": 50})
    path = save_checkpoint(micro_model(0, other), tmp_path / "other-vocab")
    with pytest.raises(InvalidValue, match="vocabulary of 50 tokens, the target 97"):
        Engine(micro_model(0), EngineConfig(speculative_config=draft_config(str(path))))


def test_defaults_follow_vllm():
    c = SpeculativeConfig.of({"method": "ngram"})
    assert (c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == (4, 5, 5)
    assert SpeculativeConfig.of({"method": "ngram", "prompt_lookup_max": 3}).prompt_lookup_min == 3
    assert SpeculativeConfig.of({"method": "ngram", "prompt_lookup_min": 2}).prompt_lookup_max == 2
