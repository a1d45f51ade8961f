"""Exercise 7's checks reject known-wrong goodputs and accept right ones written
differently; and minilm.metrics' goodputs agree with their definitions on the hand-made runs."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from labs import checks  # noqa: E402
from minilm.metrics import (  # noqa: E402
    distserve_goodput,
    meets_slo,
    request_goodput,
    slo_attainment,
    summarize,
)


def good(ttft, tpot, ttft_slo, tpot_slo):
    return (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)


def strict(ttft, tpot, ttft_slo, tpot_slo):
    return (ttft_slo is None or ttft < ttft_slo) and (tpot_slo is None or tpot < tpot_slo)


def tpot_guarded(r):
    return (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0


def meets(r, ttft_slo, tpot_slo):  # the solution's meets_slo
    if r.t_first_token is None:
        return False
    return good(r.t_first_token - r.arrival, tpot_guarded(r), ttft_slo, tpot_slo)


# ---- tightest_ttft_slo: right, written differently -----------------------------------------------
def tightest(tl, tpot_slo, target, meets_fn=meets, n_of=len, ttft_of=None, rank=None, none=None):
    """The solution, built from parts so that each wrong variant changes one."""
    ttft_of = ttft_of or (lambda r: r.t_first_token - r.arrival)
    n = n_of(tl.requests)
    ttfts = sorted(ttft_of(r) for r in tl.requests if meets_fn(r, None, tpot_slo))
    if rank is not None:
        k = rank(n, target)
        return ttfts[k - 1] if 0 < k <= len(ttfts) else none
    for k, ttft in enumerate(ttfts, start=1):
        if k / n >= target:
            return ttft
    return none


def tightest_by_bisecting_the_limits(tl, tpot_slo, target):
    """Right: tries each distinct TTFT as a limit, smallest first, counting with meets_slo."""
    limits = sorted(
        {r.t_first_token - r.arrival for r in tl.requests if r.t_first_token is not None}
    )
    for limit in limits:
        if sum(meets(r, limit, tpot_slo) for r in tl.requests) >= target * len(tl.requests):
            return limit
    return None


def tightest_with_numpy(tl, tpot_slo, target):  # right: numpy, the rank by Fractions
    ttft = np.array(
        [r.t_first_token - r.arrival if meets(r, None, tpot_slo) else np.inf for r in tl.requests]
    )
    k = math.ceil(Fraction(target).limit_denominator(1000) * len(ttft))
    value = np.sort(ttft)[k - 1]
    return float(value) if np.isfinite(value) else None


RIGHT_TIGHTEST = {
    "solution": tightest,
    "limits tried in turn": tightest_by_bisecting_the_limits,
    "numpy": tightest_with_numpy,
    "minilm.metrics' meets_slo": lambda tl, b, t: tightest(tl, b, t, meets_fn=meets_slo),
}


# ---- tightest_ttft_slo: wrong --------------------------------------------------------------------
def with_first_token(reqs):
    return len([r for r in reqs if r.t_first_token is not None])


def meets_no_tpot(r, ttft_slo, tpot_slo):
    return meets(r, ttft_slo, None)


def meets_not_aborted(r, ttft_slo, tpot_slo):
    return r.finish_reason != "aborted" and meets(r, ttft_slo, tpot_slo)


def percentile_of_ttfts(tl, tpot_slo, target):  # wrong: numpy's interpolated percentile
    return float(
        np.percentile(
            [r.t_first_token - r.arrival for r in tl.requests if r.t_first_token], 100 * target
        )
    )


def distinct_ttfts(tl, tpot_slo, target):  # wrong: two requests with one TTFT counted once
    ttfts = sorted({r.t_first_token - r.arrival for r in tl.requests if meets(r, None, tpot_slo)})
    k = math.ceil(target * len(tl.requests))
    return ttfts[k - 1] if k <= len(ttfts) else None


WRONG_TIGHTEST = {
    "share of the requests with a first token": (
        lambda tl, b, t: tightest(tl, b, t, n_of=with_first_token),
        "those aborted before a first token too",
    ),
    "TPOT limit ignored": (
        lambda tl, b, t: tightest(tl, b, t, meets_fn=meets_no_tpot),
        "meets both limits",
    ),
    "rank rounded down": (
        lambda tl, b, t: tightest(tl, b, t, rank=lambda n, t: int(n * t)),
        "rounding down",
    ),
    "one too far": (
        lambda tl, b, t: tightest(tl, b, t, rank=lambda n, t: math.ceil(n * t) + 1),
        "counting from 1",
    ),
    "equal TTFTs once": (distinct_ttfts, "two requests"),
    "aborted after the first token left out": (
        lambda tl, b, t: tightest(tl, b, t, meets_fn=meets_not_aborted),
        "aborted after its first token",
    ),
    "interpolated percentile": (percentile_of_ttfts, "interpolated percentile"),
    "TTFT from scheduling": (
        lambda tl, b, t: tightest(tl, b, t, ttft_of=lambda r: r.t_first_token - r.t_scheduled),
        "",
    ),
    "0 when none is enough": (lambda tl, b, t: tightest(tl, b, t, none=0.0), "return None"),
    "infinity when none is enough": (
        lambda tl, b, t: tightest(tl, b, t, none=math.inf),
        "return None",
    ),
}


def test_meets_slo_is_a_warm_up_the_check_does_not_take():
    """Issue 29: minilm/metrics.py has meets_slo, so exercise 7 no longer grades it."""
    import inspect

    assert list(inspect.signature(checks.check_tightest_ttft_slo).parameters) == [
        "tightest_ttft_slo"
    ]


@pytest.mark.parametrize("fn", RIGHT_TIGHTEST.values(), ids=RIGHT_TIGHTEST.keys())
def test_tightest_check_accepts(fn, capsys):
    checks.check_tightest_ttft_slo(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("case", WRONG_TIGHTEST.values(), ids=WRONG_TIGHTEST.keys())
def test_tightest_check_rejects_and_names_the_cause(case):
    fn, words = case
    with pytest.raises(AssertionError, match=words or None):
        checks.check_tightest_ttft_slo(fn)


def test_every_target_of_the_check_is_a_whole_number_of_requests_in_floats_too():
    """ceil(target * n) and the fewest k with k / n >= target agree on every hand-made case, so no
    right answer fails on float rounding."""
    for tl, _, target, _ in checks.tightest_cases():
        n = len(tl.requests)
        assert math.ceil(target * n) == next(k for k in range(n + 1) if k / n >= target)


# ---- per-percentile goodput -------------------------------------------------------------
def keeps(tl, ttft_slo, tpot_slo, target):  # the solution's rule for one run
    if ttft_slo is not None:
        met = sum(
            r.t_first_token is not None and r.t_first_token - r.arrival <= ttft_slo
            for r in tl.requests
        )
        if met < target * len(tl.requests):
            return False
    if tpot_slo is not None:
        with_tpot = [r for r in tl.requests if r.output_len > 1]
        if sum(tpot_guarded(r) <= tpot_slo for r in with_tpot) < target * len(with_tpot):
            return False
    return True


def percentile_solution(runs, ttft_slo, tpot_slo, target):
    return max(
        (rate for rate, tl in runs.items() if keeps(tl, ttft_slo, tpot_slo, target)), default=0.0
    )


def percentile_by_misses(runs, ttft_slo, tpot_slo, target):
    """Right: the misses' share at most 1 - target (at 9 of 10 and 0.9 float rounding says no:
    0.1 <= 0.09999999999999998; the check has no such run), highest rate first, a NumPy float."""

    def fine(misses, n):
        return n == 0 or misses / n <= 1 - target

    for rate in sorted(runs, reverse=True):
        reqs = runs[rate].requests
        ttft_miss = (
            sum(
                r.t_first_token is None
                or (ttft_slo is not None and r.t_first_token - r.arrival > ttft_slo)
                for r in reqs
            )
            if ttft_slo is not None
            else 0
        )
        with_tpot = [r for r in reqs if r.output_len > 1]
        tpot_miss = (
            sum(tpot_guarded(r) > tpot_slo for r in with_tpot) if tpot_slo is not None else 0
        )
        if fine(ttft_miss, len(reqs)) and fine(tpot_miss, len(with_tpot)):
            return np.float64(rate)
    return 0.0


def percentile_numpy_rank(runs, ttft_slo, tpot_slo, target):
    """Right: the target percentile at its rank (numpy's inverted_cdf) within each limit."""

    def within(values, limit):
        return (
            limit is None
            or not len(values)
            or np.percentile(values, 100 * target, method="inverted_cdf") <= limit
        )

    best = 0.0
    for rate, tl in runs.items():
        ttfts = [
            math.inf if r.t_first_token is None else r.t_first_token - r.arrival
            for r in tl.requests
        ]
        tpots = [tpot_guarded(r) for r in tl.requests if r.output_len > 1]
        if within(ttfts, ttft_slo) and within(tpots, tpot_slo):
            best = max(best, rate)
    return best


def percentile_fractions(runs, ttft_slo, tpot_slo, target):  # right: exact shares with Fractions
    def share(met, n):
        return Fraction(met, n) if n else Fraction(1)

    kept = [
        rate
        for rate, tl in runs.items()
        if (
            ttft_slo is None
            or share(
                sum(
                    r.t_first_token is not None and r.t_first_token - r.arrival <= ttft_slo
                    for r in tl.requests
                ),
                len(tl.requests),
            )
            >= Fraction(target)
        )
        and (
            tpot_slo is None
            or share(
                sum(tpot_guarded(r) <= tpot_slo for r in tl.requests if r.output_len > 1),
                sum(r.output_len > 1 for r in tl.requests),
            )
            >= Fraction(target)
        )
    ]
    return float(max(kept, default=0))


def percentile_conservative(
    runs, ttft_slo, tpot_slo, target
):  # right where a sweep's runs worsen with the rate:
    best = 0.0  # stops at the first rate that misses
    for rate in sorted(runs):
        if not keeps(runs[rate], ttft_slo, tpot_slo, target):
            break
        best = rate
    return best


def highest(rule):
    return lambda runs, a, b, target: max(
        (rate for rate, tl in runs.items() if rule(tl, a, b, target)), default=0.0
    )


def joint_distserve(
    runs, a, b, target
):  # wrong: DistServe's rule, the requests that meet both limits
    return distserve_goodput(runs, a, b, target)


def one_token_meets_tpot(
    runs, a, b, target
):  # wrong: a one-token request counted as meeting the TPOT limit
    def rule(tl, a, b, t):
        ok_ttft = a is None or slo_attainment(tl, a, None) >= t
        return ok_ttft and (
            b is None or sum(meets(r, None, b) for r in tl.requests) >= t * len(tl.requests)
        )

    return highest(rule)(runs, a, b, target)


def aborted_left_out(
    runs, a, b, target
):  # wrong: a request with no first token left out of the TTFT share
    def rule(tl, a, b, t):
        started = [r for r in tl.requests if r.t_first_token is not None]
        ok = a is None or sum(r.t_first_token - r.arrival <= a for r in started) >= t * len(started)
        return ok and keeps(tl, None, b, t)

    return highest(rule)(runs, a, b, target)


def target_ignored(runs, a, b, target):  # wrong: DistServe's example target, whatever is asked
    return highest(keeps)(runs, a, b, 0.9)


def strictly_above(runs, a, b, target):  # wrong: a share exactly at the target does not keep it
    def rule(tl, a, b, t):
        shares = [Fraction(m, n) for m, n in checks.share_counts(tl, a, b) if n]
        return all(s > Fraction(t) for s in shares)

    return highest(rule)(runs, a, b, target)


def last_in_dict_order(
    runs, a, b, target
):  # wrong: the last rate that keeps it, in the dict's order
    return next((rate for rate, tl in reversed(runs.items()) if keeps(tl, a, b, target)), 0.0)


def first_in_dict_order(
    runs, a, b, target
):  # wrong: the first rate that keeps it, in the dict's order
    return next((rate for rate, tl in runs.items() if keeps(tl, a, b, target)), 0.0)


def none_when_none(runs, a, b, target):  # wrong: None when no rate keeps the target
    return max((rate for rate, tl in runs.items() if keeps(tl, a, b, target)), default=None)


def mean_not_share(
    runs, a, b, target
):  # wrong: the mean TTFT within the limit, not a share of requests
    def rule(tl, a, b, t):
        ttfts = [r.t_first_token - r.arrival for r in tl.requests if r.t_first_token is not None]
        return (a is None or sum(ttfts) / len(ttfts) <= a) and keeps(tl, None, b, t)

    return highest(rule)(runs, a, b, target)


RIGHT_PERCENTILE = [
    percentile_solution,
    percentile_by_misses,
    percentile_numpy_rank,
    percentile_fractions,
    percentile_conservative,
]


def none_fails_no_first_token(
    runs, a, b, target
):  # wrong: with no TTFT limit, no first token misses
    def rule(tl, a, b, t):
        return keeps(tl, a, b, t) and (a is not None or all(r.t_first_token for r in tl.requests))

    return highest(rule)(runs, a, b, target)


def failed_is_a_miss(runs, a, b, target):  # wrong: a failed request misses, whatever it produced
    return highest(
        lambda tl, a, b, t: keeps(tl, a, b, t) and not any(r.failed for r in tl.requests)
    )(runs, a, b, target)


WRONG_PERCENTILE = [
    none_fails_no_first_token,
    failed_is_a_miss,
    joint_distserve,
    one_token_meets_tpot,
    aborted_left_out,
    target_ignored,
    strictly_above,
    last_in_dict_order,
    first_in_dict_order,
    none_when_none,
    mean_not_share,
]


@pytest.mark.parametrize("fn", RIGHT_PERCENTILE, ids=lambda f: f.__name__)
def test_percentile_check_accepts(fn, capsys):
    checks.check_percentile_goodput(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("fn", WRONG_PERCENTILE, ids=lambda f: f.__name__)
def test_percentile_check_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_percentile_goodput(fn)


@pytest.mark.parametrize(
    "fn, words",
    [
        (joint_distserve, "each limit counts on its own"),
        (one_token_meets_tpot, "has no TPOT"),
        (aborted_left_out, "stays in the count"),
        (target_ignored, "the target you are given"),
        (strictly_above, "exactly at the target"),
        (last_in_dict_order, "whatever order"),
        (first_in_dict_order, "whatever order"),
        (none_when_none, "0.0 req/s"),
        (none_fails_no_first_token, "no TTFT limit to miss"),
        (failed_is_a_miss, "failed request that produced tokens"),
    ],
)
def test_percentile_message_names_the_cause(fn, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_percentile_goodput(fn)


def test_a_sweep_in_dict_order_is_not_told_to_use_its_target():
    with pytest.raises(AssertionError) as e:
        checks.check_percentile_goodput(last_in_dict_order)
    assert "target you are given" not in str(e.value)


# ---- the metrics themselves ---------------------------------------------------------------
def test_metrics_goodputs_on_the_handmade_runs():
    tl = checks.handmade_timeline(checks.HANDMADE, end=2.5)
    for slos, want in (
        ((None, None), 2.0),
        ((0.5, None), 1.5),
        ((None, 0.125), 2.0),
        ((None, 0.1), 0.5),
        ((0.25, 0.1), 0.5),
    ):
        assert request_goodput(tl, *slos) == pytest.approx(want)
    assert summarize(tl, 0.5, 0.125)["goodput_req_per_s"] == pytest.approx(1.5)
    assert summarize(tl, 0.5, 0.125)["slo_attainment"] == pytest.approx(0.75)
    aborted = checks.handmade_timeline(checks.HANDMADE + [checks.ABORTED], end=2.5)
    assert request_goodput(aborted, None, None) == pytest.approx(2.0)
    runs = {rate: checks.PERCENTILE_RUNS[rate] for rate in (1.0, 2.0, 4.0)}
    assert distserve_goodput(runs, 0.5, 0.25, 0.875) == 1.0  # 6 of 8 meet both at 2 req/s
    assert checks.percentile_reference(runs, 0.5, 0.25, 0.875) == 2.0  # 7 of 8 within each limit
    assert distserve_goodput({8.0: checks.PERCENTILE_RUNS[8.0]}, 0.5, None) == 0.0


# ---- part 3: which rates to run --------------------------------------------------------------------
def search_solution(run_at, rates, a, b, target):
    lo, hi = 0, len(rates)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if slo_attainment(run_at(rates[mid - 1]), a, b) >= target:
            lo = mid
        else:
            hi = mid - 1
    return rates[lo - 1] if lo else 0.0


def search_recursive(run_at, rates, a, b, target):
    """Right, written differently: run the middle rate of the list (the upper middle), recurse on
    the half it leaves, exact shares with Fractions."""
    if not rates:
        return 0.0
    mid = len(rates) // 2
    tl = run_at(rates[mid])
    met = sum(meets_slo(r, a, b) for r in tl.requests)
    if Fraction(met, len(tl.requests)) >= Fraction(target):
        above = search_recursive(run_at, rates[mid + 1 :], a, b, target)
        return above or rates[mid]
    return search_recursive(run_at, rates[:mid], a, b, target)


def search_scan(run_at, rates, a, b, target):  # wrong: right answers, one run per rate
    return max((r for r in rates if slo_attainment(run_at(r), a, b) >= target), default=0.0)


def search_ends_first(run_at, rates, a, b, target):  # wrong: spends runs on both ends first
    if not rates or slo_attainment(run_at(rates[0]), a, b) < target:
        return 0.0
    if slo_attainment(run_at(rates[-1]), a, b) >= target:
        return rates[-1]
    lo, hi = 0, len(rates) - 1  # rates[lo] keeps, rates[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if slo_attainment(run_at(rates[mid]), a, b) >= target:
            lo = mid
        else:
            hi = mid
    return rates[lo]


def search_strict(run_at, rates, a, b, target):  # wrong: attainment exactly at the target fails
    return search_solution(run_at, rates, a, b, target + 1e-12)


def search_ttft_only(run_at, rates, a, b, target):  # wrong: the TPOT limit left out
    return search_solution(run_at, rates, a, None, target)


def search_one_past(run_at, rates, a, b, target):  # wrong: returns the lowest rate that misses
    lo, hi = 0, len(rates)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if slo_attainment(run_at(rates[mid - 1]), a, b) >= target:
            lo = mid
        else:
            hi = mid - 1
    return rates[min(lo, len(rates) - 1)] if rates else 0.0


def search_none(run_at, rates, a, b, target):  # wrong: None when no rate keeps the target
    return search_solution(run_at, rates, a, b, target) or None


def search_lower_middle(run_at, rates, a, b, target):  # wrong: can loop forever (lo = mid)
    lo, hi = 0, len(rates)
    while lo < hi:
        mid = (lo + hi) // 2
        if mid and slo_attainment(run_at(rates[mid - 1]), a, b) >= target:
            lo = mid
        else:
            hi = mid - 1 if mid else 0
    return rates[lo - 1] if lo else 0.0


@pytest.mark.parametrize("fn", [search_solution, search_recursive], ids=lambda f: f.__name__)
def test_goodput_search_accepts(fn, capsys):
    checks.check_goodput_search(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (search_scan, "need at most"),
        (search_ends_first, "need at most"),
        (search_strict, "does not keep it|a higher rate keeps it"),
        (search_ttft_only, "does not keep it"),
        (search_one_past, "does not keep it"),
        (search_none, "one of the rates, or 0.0"),
        (search_lower_middle, "more than 10 s|need at most|a higher rate"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_goodput_search_rejects(fn, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_goodput_search(fn)


# ---- best_seats (part 4) -----------------------------------------------------------------------
def seats_fibonacci(run_with, seats, a, b, ties_right=False, places=0):
    """The solution: a Fibonacci search over the candidates padded with -inf; `ties_right` and
    `places` (padding one place short) are its wrong variants."""
    known = {}

    def att(i):
        if i >= len(seats) - places:
            return -math.inf
        if i not in known:
            known[i] = slo_attainment(run_with(seats[i]), a, b)
        return known[i]

    fib = [1, 1]
    while fib[-1] - 1 < len(seats) - places:
        fib.append(fib[-1] + fib[-2])
    k, lo = len(fib) - 1, 0
    while fib[k] - 1 > 1:
        x, y = lo + fib[k - 2] - 1, lo + fib[k - 1] - 1
        if att(x) < att(y) or (ties_right and att(x) == att(y)):
            lo = x + 1
        k -= 1
    return seats[lo]


def seats_golden(run_with, seats, a, b):
    """Right, written differently: an interval [lo, hi] and the one probe known inside it; the
    next probe mirrors it, counts of requests compared as whole numbers."""
    met = {}

    def count(i):
        if i not in met:
            met[i] = sum(meets_slo(r, a, b) for r in run_with(seats[i]).requests)
        return met[i]

    lo, hi = 0, len(seats) - 1
    while lo < hi:
        if hi - lo == 1:
            return seats[lo] if count(lo) >= count(hi) else seats[hi]
        fib = [1, 2]
        while fib[-1] < hi - lo + 2:
            fib.append(fib[-1] + fib[-2])
        x = min(lo - 1 + (fib[-3] if len(fib) > 2 else 1), hi - 1)
        y = min(lo - 1 + fib[-2], hi)
        x, y = (x, y) if x < y else (y - 1, y)
        if count(x) < count(y):
            lo = x + 1
        else:
            hi = y - 1
    return seats[lo]


def seats_scan(run_with, seats, a, b):  # wrong: right answers, one run per candidate
    attain = [slo_attainment(run_with(s), a, b) for s in seats]
    return seats[attain.index(max(attain))]


def seats_peak_bisection(run_with, seats, a, b):  # wrong: the textbook peak search, runs kept
    known = {}

    def att(i):
        if i not in known:
            known[i] = slo_attainment(run_with(seats[i]), a, b)
        return known[i]

    lo, hi = 0, len(seats) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if att(mid) < att(mid + 1):
            lo = mid + 1
        else:
            hi = mid
    return seats[lo]


def seats_ternary(run_with, seats, a, b):  # wrong: two new runs a round
    lo, hi = 0, len(seats) - 1
    while hi - lo > 1:
        x, y = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if slo_attainment(run_with(seats[x]), a, b) < slo_attainment(run_with(seats[y]), a, b):
            lo = x + 1
        else:
            hi = y - 1 if y - 1 >= x else y
    if lo == hi:
        return seats[lo]
    return max(seats[lo : hi + 1], key=lambda s: slo_attainment(run_with(s), a, b))


def seats_ties_right(run_with, seats, a, b):  # wrong: `<=`, a tie goes right
    return seats_fibonacci(run_with, seats, a, b, ties_right=True)


def seats_last_left_out(run_with, seats, a, b):  # wrong: padded one place short
    return seats_fibonacci(run_with, seats, a, b, places=1) if len(seats) > 1 else seats[0]


def seats_index(run_with, seats, a, b):  # wrong: the index, not the candidate
    return seats.index(seats_fibonacci(run_with, seats, a, b))


def seats_runs_one(run_with, seats, a, b):  # wrong: runs the single candidate
    if len(seats) == 1:
        run_with(seats[0])
    return seats_fibonacci(run_with, seats, a, b)


def seats_unkept(run_with, seats, a, b):  # wrong: the solution's probes, each run afresh
    def att(i):
        return -math.inf if i >= len(seats) else slo_attainment(run_with(seats[i]), a, b)

    fib = [1, 1]
    while fib[-1] - 1 < len(seats):
        fib.append(fib[-1] + fib[-2])
    k, lo = len(fib) - 1, 0
    while fib[k] - 1 > 1:
        x, y = lo + fib[k - 2] - 1, lo + fib[k - 1] - 1
        if att(x) < att(y):
            lo = x + 1
        k -= 1
    return seats[lo]


def test_the_seats_budget_is_what_a_fibonacci_search_needs():
    assert [checks.seats_budget(n) for n in (1, 2, 4, 9, 10)] == [0, 2, 3, 5, 5]  # as stated
    for n in range(2, 500):
        assert fib_places(checks.seats_budget(n)) >= n, n


def fib_places(k):  # candidates k runs settle: F(k + 2) - 1, F(1) = F(2) = 1
    f = [0, 1, 1]
    while len(f) < k + 3:
        f.append(f[-1] + f[-2])
    return f[k + 2] - 1


def test_the_checks_curves_meet_the_stated_assumption():
    for _seats, counts, what in checks.seats_curves():
        assert checks.unimodal(counts), what
    seats, sweep = checks.seats_sweep()
    for ttft, tpot in checks.SWEEP_SLOS:
        attain = [slo_attainment(sweep[s], ttft, tpot) for s in seats]
        assert checks.unimodal(attain), (ttft, tpot, attain)
        assert 0 < checks.best_seats_reference(attain) < len(seats) - 1  # highest inside


@pytest.mark.parametrize("fn", [seats_fibonacci, seats_golden], ids=lambda f: f.__name__)
def test_best_seats_accepts(fn, capsys):
    checks.check_best_seats(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (seats_scan, "needs no run"),
        (seats_peak_bisection, "no candidate twice"),
        (seats_ternary, "runs"),
        (seats_unkept, "more than once"),
        (seats_ties_right, "on a tie the answer is the smallest"),
        (seats_last_left_out, "last candidate: can your search reach it"),
        (seats_index, "one of the candidates"),
        (seats_runs_one, "one candidate the answer needs no run"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_best_seats_rejects(fn, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_best_seats(fn)
