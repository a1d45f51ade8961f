"""Exercise 8's check rejects the known wrong answers and accepts right ones written differently.

Each wrong variant is a mistake a learner can plausibly make; each must fail
`check_prefix_lookup` with an AssertionError. Each right variant computes the same
hits by another route and must pass.
"""

from __future__ import annotations

import hashlib
import sys
from itertools import takewhile
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402
from labs.checks import check_prefix_lookup  # noqa: E402


# ---- keys -----------------------------------------------------------------------------------
def chained_keys(tokens, block_size):
    """The solution's: (hash of the parent's key, this block's tokens), full blocks only."""
    keys, parent = [], None
    for start in range(0, len(tokens) // block_size * block_size, block_size):
        parent = (
            hash(parent) if parent is not None else None,
            tuple(tokens[start : start + block_size]),
        )
        keys.append(parent)
    return keys


def sha256_keys(tokens, block_size):
    """Right: a hex digest chain (vLLM can use sha256), written as a while loop."""
    keys, digest, start = [], b"", 0
    while start + block_size <= len(tokens):
        digest = hashlib.sha256(digest + repr(tokens[start : start + block_size]).encode()).digest()
        keys.append(digest.hex())
        start += block_size
    return keys


def whole_prefix_keys(tokens, block_size):
    """Right, without hashing: the key is the whole prefix up to the block's end."""
    return [tuple(tokens[:end]) for end in range(block_size, len(tokens) + 1, block_size)]


def nested_keys(tokens, block_size):
    """Right: the parent key itself (not its hash) inside the child's key."""
    keys = []
    for b in range(len(tokens) // block_size):
        keys.append(
            (keys[-1] if keys else None, tuple(tokens[b * block_size : (b + 1) * block_size]))
        )
    return keys


def partial_block_keys(tokens, block_size):
    """Wrong: names the last, partly filled block too."""
    keys, parent = [], None
    for start in range(0, len(tokens), block_size):
        parent = (hash(parent), tuple(tokens[start : start + block_size]))
        keys.append(parent)
    return keys


def parentless_keys(tokens, block_size):
    """Wrong: a block named by its own tokens only."""
    return [
        tuple(tokens[s : s + block_size])
        for s in range(0, len(tokens) // block_size * block_size, block_size)
    ]


def positional_keys(tokens, block_size):
    """Wrong: own tokens and position, still no parent."""
    return [
        (s, tuple(tokens[s : s + block_size]))
        for s in range(0, len(tokens) // block_size * block_size, block_size)
    ]


def parent_tokens_keys(tokens, block_size):
    """Wrong: the parent's tokens instead of the parent's key (covers one block back, not the prefix)."""
    blocks = [
        tuple(tokens[s : s + block_size])
        for s in range(0, len(tokens) // block_size * block_size, block_size)
    ]
    return [(blocks[i - 1] if i else None, b) for i, b in enumerate(blocks)]


# ---- lookups (each uses the key function it is paired with) ------------------------------------
def lookup_with(keys_fn, variant):
    def lookup(tokens, block_size, cache):
        return variant(keys_fn, tokens, block_size, cache)

    return lookup


def solution_lookup(keys_fn, tokens, block_size, cache):
    n = 0
    for key in keys_fn(tokens[:-1], block_size):
        if key not in cache:
            break
        n += 1
    return n * block_size


def capped_lookup(keys_fn, tokens, block_size, cache):
    """Right: all keys, then the cap on blocks that leave the last token out."""
    keys = keys_fn(tokens, block_size)[: (len(tokens) - 1) // block_size]
    return block_size * sum(1 for _ in takewhile(lambda k: k in cache, keys))


def while_lookup(keys_fn, tokens, block_size, cache):
    """Right: counts tokens, stops one short of the prompt's end."""
    keys, n = keys_fn(tokens, block_size), 0
    while (
        n // block_size < len(keys)
        and n + block_size < len(tokens)
        and keys[n // block_size] in cache
    ):
        n += block_size
    return n


def no_recompute_lookup(keys_fn, tokens, block_size, cache):
    """Wrong: takes every cached block, even the one holding the last token."""
    return block_size * sum(1 for _ in takewhile(lambda k: k in cache, keys_fn(tokens, block_size)))


def partial_reuse_lookup(keys_fn, tokens, block_size, cache):
    """Wrong: recomputes only the last token, reusing the rest of its block."""
    hits = sum(1 for _ in takewhile(lambda k: k in cache, keys_fn(tokens, block_size)))
    return min(hits * block_size, len(tokens) - 1)


def off_by_one_lookup(keys_fn, tokens, block_size, cache):
    """Wrong: drops the last full block always (len // bs - 1), not only when it holds the last token."""
    keys = keys_fn(tokens, block_size)[: max(0, len(tokens) // block_size - 1)]
    return block_size * sum(1 for _ in takewhile(lambda k: k in cache, keys))


def count_all_lookup(keys_fn, tokens, block_size, cache):
    """Wrong: counts every cached key, not the run from the start (a hole after an eviction)."""
    return block_size * sum(k in cache for k in keys_fn(tokens[:-1], block_size))


def blocks_lookup(keys_fn, tokens, block_size, cache):
    """Wrong: returns blocks, not tokens."""
    return solution_lookup(keys_fn, tokens, block_size, cache) // block_size


RIGHT = {
    "solution": (chained_keys, solution_lookup),
    "sha256 chain, capped lookup": (sha256_keys, capped_lookup),
    "whole-prefix keys, while lookup": (whole_prefix_keys, while_lookup),
    "nested keys, solution lookup": (nested_keys, solution_lookup),
}
WRONG = {
    "names the partial last block": (partial_block_keys, solution_lookup),
    "hashes a block without its parent": (parentless_keys, solution_lookup),
    "block position instead of parent": (positional_keys, capped_lookup),
    "parent's tokens, not its key": (parent_tokens_keys, solution_lookup),
    "does not recompute the last token": (chained_keys, no_recompute_lookup),
    "reuses a partial last block": (chained_keys, partial_reuse_lookup),
    "drops one block too many": (chained_keys, off_by_one_lookup),
    "counts cached keys past a miss": (chained_keys, count_all_lookup),
    "returns blocks, not tokens": (chained_keys, blocks_lookup),
}


@pytest.mark.parametrize("name", RIGHT)
def test_check_accepts_right_variants(name, capsys):
    keys_fn, variant = RIGHT[name]
    check_prefix_lookup(keys_fn, lookup_with(keys_fn, variant))
    assert capsys.readouterr().out.startswith("passed:")


@pytest.mark.parametrize("name", WRONG)
def test_check_rejects_wrong_variants(name):
    keys_fn, variant = WRONG[name]
    with pytest.raises(AssertionError):
        check_prefix_lookup(keys_fn, lookup_with(keys_fn, variant))


def test_wrong_lookups_fail_on_the_hand_made_cases_not_only_on_the_replay():
    """Each lookup mistake is caught by a named case, so its message says what went wrong."""
    from labs.checks import check_lookup_cases

    for name in (
        "does not recompute the last token",
        "reuses a partial last block",
        "drops one block too many",
        "counts cached keys past a miss",
        "hashes a block without its parent",
    ):
        keys_fn, variant = WRONG[name]
        with pytest.raises(AssertionError):
            check_lookup_cases(keys_fn, lookup_with(keys_fn, variant))


# ---- part 2: longest prefix first, with a limit on waiting -----------------------------------
def order_solution(waiting, now, max_wait):
    too_long = [i for i, (arrival, _) in enumerate(waiting) if now - arrival >= max_wait]
    others = [i for i in range(len(waiting)) if i not in too_long]
    return too_long + sorted(others, key=lambda i: -waiting[i][1])


def order_one_key(
    waiting, now, max_wait
):  # right: one sort key (waited too long?, longer prefix, position)
    return sorted(
        range(len(waiting)),
        key=lambda i: (
            now - waiting[i][0] < max_wait,
            0 if now - waiting[i][0] >= max_wait else -waiting[i][1],
            i,
        ),
    )


def order_deadline(waiting, now, max_wait):  # right: a deadline per request, numpy positions out
    import numpy as np

    late = [i for i, (a, _) in enumerate(waiting) if a + max_wait <= now]
    rest = sorted(set(range(len(waiting))) - set(late), key=lambda i: (-waiting[i][1], i))
    return np.array(late + rest, dtype=np.int64)


def order_strict(waiting, now, max_wait):  # wrong: waited exactly max_wait is not yet too long
    return sorted(
        range(len(waiting)),
        key=lambda i: (
            now - waiting[i][0] <= max_wait,
            -waiting[i][1] if now - waiting[i][0] <= max_wait else 0,
            i,
        ),
    )


def order_late_by_prefix(
    waiting, now, max_wait
):  # wrong: the late ones also ordered by their prefix
    late = [i for i, (a, _) in enumerate(waiting) if now - a >= max_wait]
    rest = [i for i in range(len(waiting)) if i not in late]
    return sorted(late, key=lambda i: -waiting[i][1]) + sorted(rest, key=lambda i: -waiting[i][1])


def order_late_by_arrival(
    waiting, now, max_wait
):  # wrong: the late ones by arrival, not by queue position
    late = sorted(
        (i for i, (a, _) in enumerate(waiting) if now - a >= max_wait), key=lambda i: waiting[i][0]
    )
    rest = [i for i in range(len(waiting)) if i not in late]
    return late + sorted(rest, key=lambda i: -waiting[i][1])


def order_ties_reversed(waiting, now, max_wait):  # wrong: equal prefixes in reverse queue order
    late = [i for i, (a, _) in enumerate(waiting) if now - a >= max_wait]
    rest = [i for i in range(len(waiting)) if i not in late]
    return late + sorted(rest, key=lambda i: (-waiting[i][1], -i))


def order_shortest_first(waiting, now, max_wait):  # wrong: the shortest cached prefix first
    late = [i for i, (a, _) in enumerate(waiting) if now - a >= max_wait]
    return late + sorted(
        (i for i in range(len(waiting)) if i not in late), key=lambda i: waiting[i][1]
    )


def order_late_last(waiting, now, max_wait):  # wrong: the ones that waited too long go last
    late = [i for i, (a, _) in enumerate(waiting) if now - a >= max_wait]
    return (
        sorted((i for i in range(len(waiting)) if i not in late), key=lambda i: -waiting[i][1])
        + late
    )


def order_plain_lpm(waiting, now, max_wait):  # wrong: the engine's lpm order, no limit on waiting
    return sorted(range(len(waiting)), key=lambda i: -waiting[i][1])


def order_items_not_positions(
    waiting, now, max_wait
):  # wrong: returns the (arrival, cached) pairs themselves
    return [waiting[i] for i in order_solution(waiting, now, max_wait)]


@pytest.mark.parametrize("fn", [order_solution, order_one_key, order_deadline])
def test_order_check_accepts(fn, capsys):
    from labs.checks import check_admission_order

    check_admission_order(fn)
    assert capsys.readouterr().out.startswith("passed:")


@pytest.mark.parametrize(
    "fn",
    [
        order_strict,
        order_late_by_prefix,
        order_late_by_arrival,
        order_ties_reversed,
        order_shortest_first,
        order_late_last,
        order_plain_lpm,
        order_items_not_positions,
    ],
)
def test_order_check_rejects(fn):
    from labs.checks import check_admission_order

    with pytest.raises(AssertionError):
        check_admission_order(fn)


@pytest.mark.parametrize(
    "fn, words",
    [
        (order_strict, "exactly max_wait"),
        (order_late_by_prefix, "whatever their prefixes"),
        (order_late_by_arrival, "order of arrival"),
        (order_ties_reversed, "equal cached prefixes"),
        (order_shortest_first, "longest cached prefix goes first"),
        (order_late_last, "go first"),
    ],
)
def test_order_message_names_the_cause(fn, words):
    from labs.checks import check_admission_order

    with pytest.raises(AssertionError, match=words):
        check_admission_order(fn)


# ---- part 3: the order in the engine --------------------------------------------------------
from minilm.core.policies import Policy  # noqa: E402


class PrefixFirst(Policy):
    """The solution, with the order function and the pieces a slip changes as knobs."""

    name = "test-prefix-first"
    order = staticmethod(order_solution)
    memo: dict | None = None  # a slip: the cached prefix remembered from the first look
    keep_queue = True  # a slip when False: admits in the order, then restores arrival order

    def __init__(self, max_wait, cached_tokens):
        self.max_wait, self.cached_tokens = max_wait, cached_tokens
        self.seen = {}

    def cached(self, req):
        if self.memo is None:
            return self.cached_tokens(req)
        return self.seen.setdefault(req.request_id, self.cached_tokens(req))

    def decodes(self, s):
        for req in s.unscheduled_running():
            s.schedule_running(req, 1)

    def fill(self, s):
        while s.waiting and s.can_admit(s.waiting[0], s.waiting[0].num_remaining):
            s.admit(s.waiting[0], s.waiting[0].num_remaining)

    def schedule(self, s) -> None:
        self.decodes(s)
        queue = list(s.waiting)
        order = self.order([(r.arrival, self.cached(r)) for r in queue], s.now, self.max_wait)
        s.reorder_waiting([queue[i] for i in order])
        self.fill(s)
        if not self.keep_queue:
            s.reorder_waiting(sorted(s.waiting, key=queue.index))


class PrefixFirstOneSort(Policy):
    """Right, written differently: one sort of the queue itself with a key that puts the ones
    that waited too long first (sorted() is stable: both groups keep their queue order)."""

    name = "test-one-sort"

    def __init__(self, max_wait, cached_tokens):
        self.max_wait, self.cached_tokens = max_wait, cached_tokens

    def schedule(self, s) -> None:
        for req in list(s.unscheduled_running()):
            s.schedule_running(req, 1)

        def key(r):
            late = s.now - r.arrival >= self.max_wait
            return (0, 0) if late else (1, -self.cached_tokens(r))

        s.reorder_waiting(sorted(s.waiting, key=key))
        while s.waiting:
            head = s.waiting[0]
            if not s.can_admit(head, head.num_remaining):
                break
            s.admit(head, head.num_remaining)


def prefix_variant(name, **knobs):
    return type(name, (PrefixFirst,), knobs)


class AdmitsBeforeDecodes(PrefixFirst):
    def schedule(self, s) -> None:
        queue = list(s.waiting)
        order = self.order([(r.arrival, self.cached(r)) for r in queue], s.now, self.max_wait)
        s.reorder_waiting([queue[i] for i in order])
        self.fill(s)
        self.decodes(s)


PREFIX_RIGHT = [PrefixFirst, PrefixFirstOneSort]
PREFIX_WRONG = [
    (
        prefix_variant("Fcfs", order=staticmethod(lambda w, now, m: list(range(len(w))))),
        "arrived first",
    ),
    (prefix_variant("NoLimit", order=staticmethod(order_plain_lpm)), "goes first"),
    (prefix_variant("LateLast", order=staticmethod(order_late_last)), "goes first"),
    (prefix_variant("StaleCache", memo={}), "cached at the time|cached now"),
    (prefix_variant("RestoresArrivalOrder", keep_queue=False), "the order you chose"),
    (
        AdmitsBeforeDecodes,
        "schedule every decode before you admit",
    ),  # "is each prefix the one cached now?" before
]


@pytest.mark.parametrize("policy", PREFIX_RIGHT, ids=lambda p: p.__name__)
def test_prefix_first_policy_accepts(policy, capsys):
    checks.check_prefix_first_policy(policy)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("policy, words", PREFIX_WRONG, ids=lambda x: getattr(x, "__name__", ""))
def test_prefix_first_policy_rejects(policy, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_prefix_first_policy(policy)
