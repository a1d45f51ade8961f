"""The prefix-caching workloads: what they promise about their prompts and arrivals."""

import pytest

from minilm import Engine, make_workload
from minilm.workload import recommended_knobs


def test_shared_prefix_puts_few_long_system_prompts_before_short_turns():
    specs = make_workload(
        "shared-prefix", num_requests=40, seed=3, vocab_size=500, max_model_len=1024
    )
    assert specs == make_workload(
        "shared-prefix", num_requests=40, seed=3, vocab_size=500, max_model_len=1024
    )
    prefixes = {
        tuple(s.prompt_ids[:128]) for s in specs
    }  # every system prompt is at least 1024 // 8 long
    assert 1 < len(prefixes) <= 4
    for s in specs:
        assert 1024 // 8 + 8 <= len(s.prompt_ids) < 1024 // 4 + 33


def test_multi_turn_resends_the_conversation_so_far():
    specs = make_workload("multi-turn", num_requests=16, seed=1, vocab_size=500, rate=2.0)
    assert [s.arrival for s in specs] == sorted(s.arrival for s in specs)
    by_conversation: dict[str, list] = {}
    for s in specs:
        by_conversation.setdefault(s.id.split("-")[0], []).append(s)
    for turns in by_conversation.values():
        turns.sort(key=lambda s: int(s.id.split("-t")[1]))
        for earlier, later in zip(turns, turns[1:]):
            # the next turn starts with this turn's prompt, then its reply (max_tokens long), then a new turn
            assert later.prompt_ids[: len(earlier.prompt_ids)] == earlier.prompt_ids
            assert len(later.prompt_ids) > len(earlier.prompt_ids) + earlier.max_tokens
            assert later.arrival > earlier.arrival  # a think time after the earlier turn


@pytest.mark.parametrize("name", ["docstrings-shared-prefix", "docstrings-multi-turn"])
def test_docstring_versions_are_text_that_fits_the_trained_model(name):
    engine = Engine("docstrings")
    specs = make_workload(name, num_requests=60, seed=2)
    assert all(s.prompt_ids is None and s.prompt for s in specs)
    longest = max(len(engine.tokenizer.encode(s.prompt)) + s.max_tokens for s in specs)
    assert longest <= engine.config.max_model_len == 256
    engine.add_workload(specs)  # the engine's own checks accept every request


def test_only_long_prompt_recommends_knobs():
    assert recommended_knobs("long-prompt", 48, "chunked") == {
        "max_num_seqs": 48,
        "max_num_batched_tokens": 128,
    }
    assert recommended_knobs("long-prompt", 48, "continuous") == {"max_num_seqs": 48}
    assert recommended_knobs("mixed", 48, "chunked") == {}
