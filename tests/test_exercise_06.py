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
    return [
        min(remaining, left, cap or remaining) for remaining in prompt_remaining
    ]  # each gets all that is left


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


WRONG = [
    unclamped,
    ignores_cap,
    cap_on_the_whole_step,
    zero_cap_is_zero,
    prompts_before_decodes,
    budget_not_used_up,
    one_prompt_a_step,
    shortest_first,
    only_prompts_that_run,
]


# ---- right, written differently ---------------------------------------------------------
def with_accumulate(budget, num_decodes, prompt_remaining, cap=0):
    wanted = [min(r, cap) if cap > 0 else r for r in prompt_remaining]
    room = max(budget - num_decodes, 0)
    given = [
        min(total, room) for total in itertools.accumulate(wanted)
    ]  # running totals, clipped to the room
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


@pytest.mark.parametrize(
    "split_budget, words",
    [
        (zero_cap_is_zero, "a cap of 0 means no cap"),
        (prompts_before_decodes, "decodes take their tokens first"),
        (budget_not_used_up, "the budget is shared"),
        (ignores_cap, "no prompt takes more than the cap"),
        (unclamped, "never negative"),
        (only_prompts_that_run, "one entry per prompt"),
    ],
)
def test_the_message_names_the_cause(split_budget, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_split_budget(split_budget)


def test_a_zero_cap_is_not_blamed_on_the_decodes():
    with pytest.raises(AssertionError) as e:
        checks.check_split_budget(zero_cap_is_zero)
    assert "decodes" not in str(e.value)


# ---- part 2: at most max_long long prompts a step -------------------------------------------
def long_loop(budget, num_decodes, prompt_remaining, cap, max_long):  # the solution
    left = max(0, budget - num_decodes)
    chunks, longs = [], 0
    for remaining in prompt_remaining:
        long = remaining > cap
        if long and max_long is not None and longs == max_long:
            chunks.append(0)
            continue
        n = min(remaining, left, cap)
        chunks.append(n)
        left -= n
        longs += long
    return chunks


def long_two_passes(budget, num_decodes, prompt_remaining, cap, max_long):
    # right: first decide who takes part (numpy ints out), then part 1's rule over those
    import numpy as np

    allowed, longs = [], 0
    for r in prompt_remaining:
        ok = r <= cap or max_long is None or longs < max_long
        longs += r > cap and ok
        allowed.append(ok)
    given = with_accumulate(
        budget, num_decodes, [r for r, ok in zip(prompt_remaining, allowed) if ok], cap
    )
    it = iter(given)
    return np.array([next(it) if ok else 0 for ok in allowed], dtype=np.int64)


def long_infinite_limit(
    budget, num_decodes, prompt_remaining, cap, max_long
):  # right: None as an endless limit
    limit = float("inf") if max_long is None else max_long
    left, out = budget - min(budget, num_decodes), []
    for r in prompt_remaining:
        if r > cap:
            if limit <= 0:
                out.append(0)
                continue
            limit -= 1
        out.append(min(r, cap, left))
        left -= out[-1]
    return out


def long_counts_every_prompt(budget, num_decodes, prompt_remaining, cap, max_long):
    # wrong: the limit counts every prompt that runs, short ones too
    left, chunks = max(0, budget - num_decodes), []
    for i, r in enumerate(prompt_remaining):
        n = 0 if max_long is not None and i >= max_long else min(r, left, cap)
        chunks.append(n)
        left -= n
    return chunks


def long_at_cap(
    budget, num_decodes, prompt_remaining, cap, max_long
):  # wrong: exactly cap left counts as long
    return _long_with(budget, num_decodes, prompt_remaining, cap, max_long, lambda r: r >= cap)


def _long_with(budget, num_decodes, prompt_remaining, cap, max_long, is_long):
    left, chunks, longs = max(0, budget - num_decodes), [], 0
    for r in prompt_remaining:
        if is_long(r) and max_long is not None and longs == max_long:
            chunks.append(0)
            continue
        n = min(r, left, cap)
        chunks.append(n)
        left -= n
        longs += is_long(r)
    return chunks


def long_stops_at_limit(budget, num_decodes, prompt_remaining, cap, max_long):
    # wrong: the first long prompt past the limit ends the step: the short ones behind it get nothing
    left, chunks, longs, stopped = max(0, budget - num_decodes), [], 0, False
    for r in prompt_remaining:
        stopped = stopped or (r > cap and max_long is not None and longs == max_long)
        n = 0 if stopped else min(r, left, cap)
        chunks.append(n)
        left -= n
        longs += r > cap
    return chunks


def long_share_lost(budget, num_decodes, prompt_remaining, cap, max_long):
    # wrong: a skipped long prompt's share is taken out of the budget anyway
    left, chunks, longs = max(0, budget - num_decodes), [], 0
    for r in prompt_remaining:
        n = min(r, left, cap)
        skipped = r > cap and max_long is not None and longs == max_long
        chunks.append(0 if skipped else n)
        left -= n
        longs += r > cap and not skipped
    return chunks


def long_no_limit(
    budget, num_decodes, prompt_remaining, cap, max_long
):  # wrong: part 1's rule, no limit
    return with_accumulate(budget, num_decodes, prompt_remaining, cap)


@pytest.mark.parametrize("fn", [long_loop, long_two_passes, long_infinite_limit])
def test_long_check_accepts(fn, capsys):
    checks.check_split_budget_long(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn",
    [long_counts_every_prompt, long_at_cap, long_stops_at_limit, long_share_lost, long_no_limit],
)
def test_long_check_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_split_budget_long(fn)


# ---- part 3: the limit as a policy in the engine ---------------------------------------------
from minilm.core.policies import ChunkedPolicy  # noqa: E402


def is_long(n, cap):
    return n > cap


class LimitPolicy(ChunkedPolicy):
    """The solution, with one knob per plausible slip (each test's policy turns one on)."""

    name = "test-long-limit"
    long_test = staticmethod(is_long)
    count_partial, stop_at_aside, aside_to_back, queue_first = True, False, False, False
    only_long, decodes_first = True, True

    def __init__(self, max_long=None):
        self.max_long = max_long

    def decodes(self, s):
        for req in s.unscheduled_running():
            if req.num_remaining == 1:
                s.schedule_running(req, 1)

    def schedule(self, s) -> None:
        cap = s.config.long_prefill_token_threshold
        if self.decodes_first:
            self.decodes(s)
        partial, waiting = (
            [r for r in s.unscheduled_running() if r.num_remaining > 1],
            list(s.waiting),
        )
        prompts = waiting + partial if self.queue_first else partial + waiting
        left, chunks, longs = s.budget, [], 0  # with decodes last, none is left for them
        for req in prompts:
            long = self.long_test(req.num_remaining, cap) if self.only_long else True
            counted = self.count_partial or req in waiting
            if long and counted and self.max_long is not None and longs == self.max_long:
                chunks.append(0)
                continue
            n = min(req.num_remaining, left, cap)
            chunks.append(n)
            left -= n
            longs += long and counted
        plan = dict(zip(prompts, chunks))
        if not self.stop_at_aside:  # the ones that get no tokens step behind the others
            s.reorder_waiting(sorted(waiting, key=lambda r: plan[r] == 0))
        for req in prompts:
            n = plan[req]
            if req in partial:
                if n:
                    s.schedule_running(req, n)
                continue
            if n == 0:
                if self.stop_at_aside:
                    break
                continue
            if not s.can_admit(req, n):
                break
            s.admit(req, n)
        if not self.aside_to_back:  # back in their places
            s.reorder_waiting(sorted(s.waiting, key=waiting.index))
        if not self.decodes_first:
            self.decodes(s)


class LimitRebuildsQueue(ChunkedPolicy):
    """Right, written differently: counts the long prompts as it goes, sends each one that steps
    aside to the back of the queue as it meets it, and puts them first again at the end."""

    name = "test-rebuild"

    def __init__(self, max_long=None):
        self.max_long = max_long

    def schedule(self, s) -> None:
        cap = s.config.long_prefill_token_threshold
        for req in list(s.unscheduled_running()):
            if req.num_remaining == 1:
                s.schedule_running(req, 1)
        longs = 0
        for req in list(s.unscheduled_running()):
            if self.max_long is not None and req.num_remaining > cap and longs >= self.max_long:
                continue
            longs += req.num_remaining > cap
            n = min(req.num_remaining, s.budget, cap)
            if n:
                s.schedule_running(req, n)
        skipped = []
        while s.waiting and s.budget and s.waiting[0] not in skipped:
            req = s.waiting[0]
            if self.max_long is not None and req.num_remaining > cap and longs >= self.max_long:
                skipped.append(req)
                s.reorder_waiting([*list(s.waiting)[1:], req])  # to the back, for now
                continue
            n = min(req.num_remaining, s.budget, cap)
            if not s.can_admit(req, n):
                break
            longs += req.num_remaining > cap
            s.admit(req, n)
        s.reorder_waiting(skipped + [r for r in s.waiting if r not in skipped])


def variant(**knobs):
    return type("Limit_" + "_".join(knobs), (LimitPolicy,), knobs)


POLICY_RIGHT = [LimitPolicy, LimitRebuildsQueue]
POLICY_WRONG = [  # the three marked were told "left prompts waiting" before issue 29.4
    (variant(stop_at_aside=True), "left prompts waiting"),
    (variant(aside_to_back=True), "not to its end"),  # marked
    (variant(count_partial=False), "part-done prompts count"),
    (variant(only_long=False), "only long prompts count toward max_long"),  # marked
    (variant(long_test=staticmethod(lambda n, cap: n >= cap)), "exactly the cap"),  # marked
    (variant(queue_first=True), "part-done ones before the queue|refused"),
    (variant(max_long=None, __init__=lambda self, max_long=None: None), "more than max_long"),
    (variant(decodes_first=False), "refused your policy"),
]


@pytest.mark.parametrize("policy", POLICY_RIGHT, ids=lambda p: p.__name__)
def test_long_limit_policy_accepts(policy, capsys):
    checks.check_long_limit_policy(policy)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("policy, words", POLICY_WRONG, ids=lambda x: getattr(x, "__name__", ""))
def test_long_limit_policy_rejects(policy, words):
    with pytest.raises(AssertionError, match=words or None):
        checks.check_long_limit_policy(policy)
