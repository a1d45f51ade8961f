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


def test_skewed_workload_puts_a_long_request_at_every_periods_turn():
    from minilm.workload import skewed_workload

    specs = skewed_workload(40, rate=8.0, period=4, vocab_size=500)
    assert specs == skewed_workload(40, rate=8.0, period=4, vocab_size=500)
    assert [s.arrival for s in specs] == sorted(s.arrival for s in specs)
    for i, s in enumerate(specs):
        assert (400 <= s.max_tokens < 600) if i % 4 == 0 else (16 <= s.max_tokens < 48)
        assert 200 <= len(s.prompt_ids) < 400
    for bad in ({"n": 0}, {"period": 0}, {"rate": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            skewed_workload(**({"n": 8, "rate": 1.0} | bad))


def test_a_hot_system_prompt_is_picked_more_often_and_hot_0_changes_nothing():
    from minilm.workload import system_prompt_workload

    even = system_prompt_workload(4, n=200, vocab_size=500)
    assert system_prompt_workload(4, n=200, vocab_size=500, hot=0) == even

    def share_of_most_common(specs):
        firsts = [tuple(s.prompt_ids[:64]) for s in specs]
        return max(firsts.count(f) for f in set(firsts)) / len(firsts)

    hot = system_prompt_workload(4, n=200, vocab_size=500, hot=12)  # 13 of 16 picks: the first
    assert share_of_most_common(even) < 0.4 < 0.7 < share_of_most_common(hot)
    with pytest.raises(ValueError, match="hot"):
        system_prompt_workload(4, n=8, hot=-1)
