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
    requests_df,
    slo_attainment,
    summarize,
)


def span(tl):
    return max(s.t_end for s in tl.steps) - min(r.arrival for r in tl.requests)


def good(ttft, tpot, ttft_slo, tpot_slo):
    return (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)


def tpot_guarded(r):
    return (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0


def goodput_with(
    tpot_of=tpot_guarded,
    ttft_of=lambda r: r.t_first_token - r.arrival,
    span_of=span,
    compare=good,
    aborted=False,
):
    """A request goodput built from parts, so each wrong variant changes exactly one."""

    def request_goodput(tl, ttft_slo, tpot_slo):
        n = sum(
            aborted
            if r.t_first_token is None
            else compare(ttft_of(r), tpot_of(r), ttft_slo, tpot_slo)
            for r in tl.requests
        )
        return n / span_of(tl)

    return request_goodput


def meets(r, ttft_slo, tpot_slo):  # the solution's meets_slo
    if r.t_first_token is None:
        return False
    return good(r.t_first_token - r.arrival, tpot_guarded(r), ttft_slo, tpot_slo)


# ---- request goodput: wrong ------------------------------------------------------------
def strict(ttft, tpot, ttft_slo, tpot_slo):
    return (ttft_slo is None or ttft < ttft_slo) and (tpot_slo is None or tpot < tpot_slo)


def skips_one_token_requests(tl, ttft_slo, tpot_slo):  # wrong: a one-token request never counts
    return sum(meets(r, ttft_slo, tpot_slo) for r in tl.requests if r.output_len > 1) / span(tl)


def attainment_not_rate(tl, ttft_slo, tpot_slo):  # wrong: the share of requests, not a rate
    return slo_attainment(tl, ttft_slo, tpot_slo)


def good_tokens_per_second(
    tl, ttft_slo, tpot_slo
):  # wrong: tokens of the good requests, not requests
    return sum(r.output_len for r in tl.requests if meets(r, ttft_slo, tpot_slo)) / span(tl)


def crashes_on_aborted(
    tl, ttft_slo, tpot_slo
):  # wrong: t_first_token None - arrival raises TypeError
    return sum(
        good(
            r.t_first_token - r.arrival,
            tpot_guarded(r) if r.output_len > 1 else 0.0,
            ttft_slo,
            tpot_slo,
        )
        for r in tl.requests
    ) / span(tl)


WRONG_REQUEST = {  # each with the right meets_slo
    "no one-token guard": goodput_with(
        lambda r: (r.t_finished - r.t_first_token) / (r.output_len - 1)
    ),
    "one-token TPOT infinite": goodput_with(
        lambda r: (
            (r.t_finished - r.t_first_token) / (r.output_len - 1)
            if r.output_len > 1
            else float("inf")
        )
    ),
    "TPOT over output_len": goodput_with(lambda r: (r.t_finished - r.t_first_token) / r.output_len),
    "TPOT from arrival": goodput_with(lambda r: (r.t_finished - r.arrival) / r.output_len),
    "TTFT without queueing": goodput_with(ttft_of=lambda r: r.t_first_token - r.t_scheduled),
    "span from zero": goodput_with(span_of=lambda tl: max(s.t_end for s in tl.steps)),
    "span from the last arrival": goodput_with(
        span_of=lambda tl: (
            max(r.t_finished for r in tl.requests) - max(r.arrival for r in tl.requests)
        )
    ),
    "strict limits": goodput_with(compare=strict),
    "aborted counts as met": goodput_with(aborted=True),
    "skips one-token requests": skips_one_token_requests,
    "attainment, not a rate": attainment_not_rate,
    "good tokens per second": good_tokens_per_second,
    "crashes on None": goodput_with(compare=lambda a, b, c, d: a <= c and b <= d),
    "crashes on an aborted request": crashes_on_aborted,
}


def meets_strict(r, ttft_slo, tpot_slo):  # wrong: a request exactly at a limit fails it
    return r.t_first_token is not None and strict(
        r.t_first_token - r.arrival, tpot_guarded(r), ttft_slo, tpot_slo
    )


def meets_aborted(r, ttft_slo, tpot_slo):  # wrong: a request with no first token meets every limit
    return r.t_first_token is None or meets(r, ttft_slo, tpot_slo)


def meets_crashes(r, ttft_slo, tpot_slo):  # wrong: None - arrival raises TypeError
    return good(r.t_first_token - r.arrival, tpot_guarded(r), ttft_slo, tpot_slo)


WRONG_MEETS = {
    "strict": meets_strict,
    "aborted meets": meets_aborted,
    "crashes on an aborted request": meets_crashes,
}


# ---- request goodput: right, written differently ----------------------------------------
def from_token_times(tl, ttft_slo, tpot_slo):  # right: TTFT and TPOT from the token times
    start = min(r.arrival for r in tl.requests)
    end = max(step.t_end for step in tl.steps)
    count = 0
    for r in tl.requests:
        if not r.token_times:
            continue  # no token at all: no promise kept
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
        tpot = sum(gaps) / len(gaps) if gaps else 0.0
        ttft = r.token_times[0] - r.arrival
        count += (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)
    return count / (end - start)


def with_pandas(
    tl, ttft_slo, tpot_slo
):  # right: pandas, where a missing first token is NaN and fails
    df = requests_df(tl)
    ttft = df.t_first_token.astype(float) - df.arrival
    tpot = (
        (df.t_finished - df.t_first_token.astype(float)) / (df.output_len - 1).clip(lower=1)
    ).where(df.output_len > 1, 0.0)
    ok = (ttft <= (ttft_slo if ttft_slo is not None else math.inf)) & (
        tpot <= (tpot_slo if tpot_slo is not None else math.inf)
    )
    return np.float32(ok.sum() / span(tl))  # a NumPy float32, not a Python float


def by_limits_added(tl, ttft_slo, tpot_slo):  # right: compares first token with arrival + limit
    n = 0
    for r in tl.requests:
        if r.t_first_token is None:
            continue
        ok_ttft = ttft_slo is None or r.t_first_token <= r.arrival + ttft_slo
        ok_tpot = (
            tpot_slo is None
            or r.output_len < 2
            or r.t_finished - r.t_first_token <= tpot_slo * (r.output_len - 1)
        )
        n += ok_ttft and ok_tpot
    return n / span(tl)


RIGHT_REQUEST = {
    "solution": (meets, goodput_with()),
    "from token times": (meets, from_token_times),
    "span to the last finish": (
        meets,
        goodput_with(
            span_of=lambda tl: (
                max(r.t_finished for r in tl.requests) - min(r.arrival for r in tl.requests)
            )
        ),
    ),
    "pandas, float32": (meets, with_pandas),
    "limits added": (meets, by_limits_added),
    "minilm.metrics": (meets_slo, request_goodput),
}


@pytest.mark.parametrize("fn", WRONG_REQUEST.values(), ids=WRONG_REQUEST.keys())
def test_request_goodput_check_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_request_goodput(meets, fn)


@pytest.mark.parametrize("fn", WRONG_MEETS.values(), ids=WRONG_MEETS.keys())
def test_meets_slo_check_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_request_goodput(fn, goodput_with())


@pytest.mark.parametrize("fns", RIGHT_REQUEST.values(), ids=RIGHT_REQUEST.keys())
def test_request_goodput_check_accepts(fns, capsys):
    checks.check_request_goodput(*fns)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, words",
    [
        ("one-token TPOT infinite", "one-token request has no gap"),
        ("strict limits", "exactly at a limit"),
        ("TPOT over output_len", "output_len - 1"),
        ("TTFT without queueing", "time in the queue"),
        ("span from zero", "first arrival"),
        ("aborted counts as met", "kept no promise"),
        ("skips one-token requests", "counts like any other"),
        ("no one-token guard", "output_len - 1 is 0"),
        ("crashes on an aborted request", "t_first_token None"),
        ("attainment, not a rate", "not the share"),
    ],
)
def test_request_goodput_message_names_the_cause(name, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_request_goodput(meets, WRONG_REQUEST[name])


def test_a_one_token_slip_is_not_blamed_on_the_limits_or_the_span():
    with pytest.raises(AssertionError) as e:
        checks.check_request_goodput(meets, WRONG_REQUEST["one-token TPOT infinite"])
    assert "<=" not in str(e.value) and "span" not in str(e.value)


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
WRONG_PERCENTILE = [
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
