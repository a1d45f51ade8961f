"""Exercise 2's check rejects known-wrong padding predictions and accepts right ones written differently."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


def batches(lens, size):
    return [lens[i : i + size] for i in range(0, len(lens), size)]


# ---- right, written differently ---------------------------------------------------------
def padding_loop(prompts, outputs, size):  # the solution
    total = 0
    for start in range(0, len(prompts), size):
        p, o = prompts[start : start + size], outputs[start : start + size]
        total += sum(max(p) - x for x in p) + sum(max(o) - x for x in o)
    return total


def padding_rectangles(
    prompts, outputs, size
):  # each batch is a rectangle; padding is what real tokens leave
    return sum(
        len(p) * max(p) - sum(p) + len(o) * max(o) - sum(o)
        for p, o in zip(batches(prompts, size), batches(outputs, size))
    )


def padding_step_by_step(prompts, outputs, size):  # simulate each batch's steps, counting dead rows
    total = 0
    for p, o in zip(batches(prompts, size), batches(outputs, size)):
        total += sum(max(p) - x for x in p)  # the padded prefill step
        for step in range(1, max(o)):  # decode steps: token number step + 1 of each row
            total += sum(1 for x in o if x <= step)  # rows that already have all their tokens
    return total


def padding_numpy(prompts, outputs, size):  # numpy, returning a numpy integer
    total = np.int64(0)
    for p, o in zip(batches(np.array(prompts), size), batches(np.array(outputs), size)):
        total += (p.max() - p).sum() + (o.max() - o).sum()
    return total


# ---- wrong ---------------------------------------------------------------------------------
def prompt_padding_only(prompts, outputs, size):  # forgets the finished rows' bubbles
    return sum(max(p) - x for p in batches(prompts, size) for x in p)


def bubbles_only(prompts, outputs, size):  # forgets the padded prompts
    return sum(max(o) - x for o in batches(outputs, size) for x in o)


def one_batch(prompts, outputs, size):  # ignores max_num_seqs: the whole workload as one batch
    return sum(max(prompts) - x for x in prompts) + sum(max(outputs) - x for x in outputs)


def bubble_off_by_one(prompts, outputs, size):  # a finished row also pads the step it finished in
    return sum(max(p) - x for p in batches(prompts, size) for x in p) + sum(
        max(o) - x + 1 for o in batches(outputs, size) for x in o if x < max(o)
    )


def one_token_rows_never_pad(
    prompts, outputs, size
):  # a row whose only token came from prefill leaves the batch
    return sum(max(p) - x for p in batches(prompts, size) for x in p) + sum(
        max(o) - x for o in batches(outputs, size) for x in o if x > 1
    )


def padded_to_longest_sequence(
    prompts, outputs, size
):  # pads prompt + output together to the longest sum
    return sum(
        max(t) - x for t in batches([p + o for p, o in zip(prompts, outputs)], size) for x in t
    )


def sorted_batches(
    prompts, outputs, size
):  # a smarter scheduler would sort by length; this engine does not
    order = sorted(range(len(prompts)), key=lambda i: outputs[i])
    return padding_loop([prompts[i] for i in order], [outputs[i] for i in order], size)


def batches_from_the_end(prompts, outputs, size):  # groups counted from the end of the queue
    n = len(prompts)
    cuts = list(range(n, 0, -size))[::-1]
    starts = [max(c - size, 0) for c in cuts]
    return sum(padding_loop(prompts[s:c], outputs[s:c], size) for s, c in zip(starts, cuts))


def drops_partial_last_batch(prompts, outputs, size):
    # wrong: counts only full batches (len // size of them), so a last, smaller batch's padding is lost
    full = len(prompts) // size * size
    return padding_loop(prompts[:full], outputs[:full], size)


@pytest.mark.parametrize(
    "fn", [padding_loop, padding_rectangles, padding_step_by_step, padding_numpy]
)
def test_static_padding_accepts(fn, capsys):
    checks.check_static_padding(fn)
    assert "passed:" in capsys.readouterr().out


def pads_empty_seats(
    p, o, b
):  # wrong: a last, smaller batch padded to max_num_seqs rows (issue 29.3)
    total = 0
    for s in range(0, len(p), b):
        ps, outs = p[s : s + b], o[s : s + b]
        total += sum(max(ps) - x for x in ps) + sum(max(outs) - x for x in outs)
        total += (b - len(ps)) * (max(ps) + max(outs) - 1)
    return total


def finished_row_one_step_longer(
    p, o, b
):  # wrong: a finished row pads from the step it finished in
    total = 0
    for s in range(0, len(p), b):
        ps, outs = p[s : s + b], o[s : s + b]
        total += sum(max(ps) - x for x in ps) + sum(max(outs) - x + (x < max(outs)) for x in outs)
    return total


@pytest.mark.parametrize(
    "fn",
    [
        pads_empty_seats,
        finished_row_one_step_longer,
        prompt_padding_only,
        bubbles_only,
        one_batch,
        bubble_off_by_one,
        one_token_rows_never_pad,
        padded_to_longest_sequence,
        sorted_batches,
        batches_from_the_end,
        drops_partial_last_batch,
    ],
)
def test_static_padding_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_static_padding(fn)


# ---- part 2: the queue sorted by prompt length ---------------------------------------------
def sorted_stable(
    prompts, outputs, size
):  # the solution: a stable sort of the positions, then part 1
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    return padding_loop([prompts[i] for i in order], [outputs[i] for i in order], size)


def sorted_with_index(prompts, outputs, size):  # right: ties broken by arrival index, written out
    pairs = sorted(zip(prompts, range(len(prompts)), outputs))
    return padding_rectangles([p for p, _, _ in pairs], [o for _, _, o in pairs], size)


def sorted_numpy(prompts, outputs, size):  # right: numpy's stable argsort, a numpy integer out
    order = np.argsort(np.array(prompts), kind="stable")
    return padding_numpy(list(np.array(prompts)[order]), list(np.array(outputs)[order]), size)


def sorted_longest_first(
    prompts, outputs, size
):  # wrong: longest prompt first cuts different batches
    order = sorted(range(len(prompts)), key=lambda i: -prompts[i])
    return padding_loop([prompts[i] for i in order], [outputs[i] for i in order], size)


def sorted_pairs(
    prompts, outputs, size
):  # wrong: sorts (prompt, output) pairs: ties ordered by the output
    pairs = sorted(zip(prompts, outputs))  # length, which the server cannot know
    return padding_loop([p for p, _ in pairs], [o for _, o in pairs], size)


def sorted_by_output(
    prompts, outputs, size
):  # wrong: sorts by output length, which only EOS decides
    order = sorted(range(len(prompts)), key=lambda i: outputs[i])
    return padding_loop([prompts[i] for i in order], [outputs[i] for i in order], size)


def sorted_by_total(prompts, outputs, size):  # wrong: sorts by prompt + output
    order = sorted(range(len(prompts)), key=lambda i: prompts[i] + outputs[i])
    return padding_loop([prompts[i] for i in order], [outputs[i] for i in order], size)


def unsorted(prompts, outputs, size):  # wrong: part 1's answer, the queue left in arrival order
    return padding_loop(prompts, outputs, size)


def prompt_padding_gone(
    prompts, outputs, size
):  # wrong: sorting removes only part of the prompt padding
    return bubbles_only(
        *[list(x) for x in zip(*sorted(zip(prompts, outputs), key=lambda t: t[0]))], size
    )


@pytest.mark.parametrize("fn", [sorted_stable, sorted_with_index, sorted_numpy])
def test_sorted_padding_accepts(fn, capsys):
    checks.check_sorted_padding(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn",
    [
        sorted_longest_first,
        sorted_pairs,
        sorted_by_output,
        sorted_by_total,
        unsorted,
        prompt_padding_gone,
    ],
)
def test_sorted_padding_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_sorted_padding(fn)


def test_sorted_padding_says_when_the_queue_was_not_sorted():
    with pytest.raises(AssertionError, match="arrival order"):
        checks.check_sorted_padding(unsorted)


# ---- no pass by running the engine (issue 29.2) ----------------------------------------------
def padding_by_simulating(prompt_lens, output_lens, max_num_seqs):  # wrong: runs the engine
    return sum(checks.engine_padding(tuple(prompt_lens), tuple(output_lens), max_num_seqs))


def sorted_padding_by_simulating(prompt_lens, output_lens, max_num_seqs):  # wrong: the same, sorted
    return sum(
        checks.engine_padding(*checks.by_prompt_length(prompt_lens, output_lens), max_num_seqs)
    )


@pytest.mark.parametrize(
    "check, fn",
    [
        (checks.check_static_padding, padding_by_simulating),
        (checks.check_sorted_padding, sorted_padding_by_simulating),
    ],
    ids=["static", "sorted"],
)
def test_a_padding_prediction_cannot_run_the_engine(check, fn):
    checks.engine_padding.cache_clear()  # the check's own runs are cached: the learner's must not hit them
    with pytest.raises(AssertionError, match="tried to run the engine"):
        check(fn)


# ---- part 3: cut the sorted queue where it pays -----------------------------------------------
def sort_queue(prompts, outputs):
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    return [prompts[i] for i in order], [outputs[i] for i in order]


def one_batch_padding(prompts, outputs):
    return sum(max(prompts) - p for p in prompts) + sum(max(outputs) - o for o in outputs)


def least_dp(prompts, outputs, size, sort=True, batches=None, largest=None, key=one_batch_padding):
    """The solution's dynamic programme, with one knob per slip."""
    ps, os_ = sort_queue(prompts, outputs) if sort else (list(prompts), list(outputs))
    n, largest = len(ps), largest or size
    m_max = batches or -(-n // size)
    best = {(0, 0): (0, 0)}  # (requests, batches) -> (cost by key, padding)
    for j in range(1, n + 1):
        for m in range(1, m_max + 1):
            options = [
                (
                    best[i, m - 1][0] + key(ps[i:j], os_[i:j]),
                    best[i, m - 1][1] + one_batch_padding(ps[i:j], os_[i:j]),
                )
                for i in range(max(0, j - largest), j)
                if (i, m - 1) in best
            ]
            if options:
                best[j, m] = min(options)
    return best[n, m_max][1] if (n, m_max) in best else None


def least_memoized(prompts, outputs, size):  # right: recursion over where the first batch ends
    import functools

    ps, os_ = sort_queue(prompts, outputs)
    n = len(ps)

    @functools.cache
    def cost(i, m):  # the least padding of ps[i:] in m batches
        if i == n:
            return 0 if m == 0 else float("inf")
        if m == 0:
            return float("inf")
        return min(
            one_batch_padding(ps[i:j], os_[i:j]) + cost(j, m - 1)
            for j in range(i + 1, min(n, i + size) + 1)
        )

    return int(cost(0, -(-n // size)))


def least_brute_force(prompts, outputs, size):  # right: every cut, itertools
    import itertools

    ps, os_ = sort_queue(prompts, outputs)
    n, m = len(ps), -(-len(ps) // size)
    best = None
    for cuts in itertools.combinations(range(1, n), m - 1):
        edges = [0, *cuts, n]
        if all(b - a <= size for a, b in zip(edges, edges[1:])):
            pad = sum(one_batch_padding(ps[a:b], os_[a:b]) for a, b in zip(edges, edges[1:]))
            best = pad if best is None else min(best, pad)
    return best


WRONG_LEAST = {
    "full batches": (lambda p, o, b: sorted_stable(p, o, b), "full batches from the front"),
    "any number of batches": (lambda p, o, b: least_dp(p, o, b, batches=len(p)), "no more"),
    "batches one too small": (lambda p, o, b: least_dp(p, o, b, largest=b - 1), "not fewer"),
    "arrival order": (
        lambda p, o, b: least_dp(p, o, b, sort=False),
        "sorted by prompt length first",
    ),
    "cuts chosen by prompt padding": (
        lambda p, o, b: least_dp(p, o, b, key=lambda ps, os_: sum(max(ps) - x for x in ps)),
        "output padding changes too",
    ),
}


@pytest.mark.parametrize(
    "fn", [lambda p, o, b: least_dp(p, o, b), least_memoized, least_brute_force]
)
def test_least_padding_accepts(fn, capsys):
    checks.check_least_padding(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("case", WRONG_LEAST.values(), ids=WRONG_LEAST.keys())
def test_least_padding_rejects_and_names_the_cause(case):
    fn, words = case
    with pytest.raises(AssertionError, match=words):
        checks.check_least_padding(fn)
