"""Exercise 6's check rejects known-wrong chunk-splitting rules and accepts right ones
written differently."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from labs import checks  # noqa: E402


# ---- wrong: each misses one part of the rule ---------------------------------------
def unclamped(budget, num_decodes, prompt_remaining, cap=0):
    left = budget - num_decodes  # more decodes than budget: negative chunks
    chunks = []
    for remaining in prompt_remaining:
        n = min(remaining, left, cap or remaining)
        chunks.append(n)
        left -= n
    return chunks


def ignores_cap(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    chunks = []
    for remaining in prompt_remaining:
        chunks.append(min(remaining, left))
        left -= chunks[-1]
    return chunks


def cap_on_the_whole_step(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    left = min(left, cap) if cap else left  # caps all prompts together, not each one
    chunks = []
    for remaining in prompt_remaining:
        chunks.append(min(remaining, left))
        left -= chunks[-1]
    return chunks


def zero_cap_is_zero(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    chunks = []
    for remaining in prompt_remaining:
        chunks.append(min(remaining, left, cap))  # cap 0 should mean "no cap"
        left -= chunks[-1]
    return chunks


def prompts_before_decodes(budget, num_decodes, prompt_remaining, cap=0):
    left = budget  # the decodes' tokens are never taken out
    chunks = []
    for remaining in prompt_remaining:
        chunks.append(min(remaining, left, cap or remaining))
        left -= chunks[-1]
    return chunks


def budget_not_used_up(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    return [min(remaining, left, cap or remaining) for remaining in prompt_remaining]  # each gets all that is left


def one_prompt_a_step(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    return [min(r, left, cap or r) if i == 0 else 0 for i, r in enumerate(prompt_remaining)]


def shortest_first(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    chunks = [0] * len(prompt_remaining)
    for i in sorted(range(len(prompt_remaining)), key=lambda i: prompt_remaining[i]):
        chunks[i] = min(prompt_remaining[i], left, cap or prompt_remaining[i])
        left -= chunks[i]
    return chunks


def only_prompts_that_run(budget, num_decodes, prompt_remaining, cap=0):
    left = max(0, budget - num_decodes)
    chunks = []
    for remaining in prompt_remaining:
        n = min(remaining, left, cap or remaining)
        if n:
            chunks.append(n)  # drops the zeros: the list no longer lines up with the prompts
        left -= n
    return chunks


WRONG = [unclamped, ignores_cap, cap_on_the_whole_step, zero_cap_is_zero, prompts_before_decodes,
         budget_not_used_up, one_prompt_a_step, shortest_first, only_prompts_that_run]


# ---- right, written differently ---------------------------------------------------------
def with_accumulate(budget, num_decodes, prompt_remaining, cap=0):
    wanted = [min(r, cap) if cap > 0 else r for r in prompt_remaining]
    room = max(budget - num_decodes, 0)
    given = [min(total, room) for total in itertools.accumulate(wanted)]  # running totals, clipped to the room
    return [b - a for a, b in zip([0] + given, given)]


def as_tuple(budget, num_decodes, prompt_remaining, long_prefill_token_threshold=0):
    left = budget - min(budget, num_decodes)
    out = ()
    for r in prompt_remaining:
        take = min(r, left)
        if long_prefill_token_threshold:
            take = min(take, long_prefill_token_threshold)
        out += (take,)
        left -= take
    return out


def with_infinity(budget, num_decodes, prompt_remaining, cap=0):
    limit = cap if cap else float("inf")
    left = max(budget - num_decodes, 0)
    chunks = []
    while len(chunks) < len(prompt_remaining):
        n = int(min(prompt_remaining[len(chunks)], left, limit))
        chunks.append(n)
        left -= n
    return chunks


RIGHT = [with_accumulate, as_tuple, with_infinity]


@pytest.mark.parametrize("split_budget", WRONG, ids=lambda f: f.__name__)
def test_check_rejects_a_wrong_rule(split_budget):
    with pytest.raises(AssertionError):
        checks.check_split_budget(split_budget)


@pytest.mark.parametrize("split_budget", RIGHT, ids=lambda f: f.__name__)
def test_check_accepts_a_right_rule_written_differently(split_budget, capsys):
    checks.check_split_budget(split_budget)
    assert "passed:" in capsys.readouterr().out
