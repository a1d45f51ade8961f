"""Exercise 7's checks reject known-wrong goodputs and accept right ones written
differently; and minilm.metrics' two goodputs agree with their definitions."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from labs import checks  # noqa: E402
from minilm.metrics import distserve_goodput, request_goodput, requests_df, slo_attainment, summarize  # noqa: E402


def span(tl):
    return max(s.t_end for s in tl.steps) - min(r.arrival for r in tl.requests)


def good(ttft, tpot, ttft_slo, tpot_slo):
    return (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)


def goodput_with(tpot_of, ttft_of=lambda r: r.t_first_token - r.arrival, span_of=span, compare=good):
    """A request goodput built from parts, so each wrong variant changes exactly one."""
    def request_goodput(tl, ttft_slo, tpot_slo):
        n = sum(compare(ttft_of(r), tpot_of(r), ttft_slo, tpot_slo) for r in tl.requests)
        return n / span_of(tl)
    return request_goodput


def tpot_guarded(r):
    return (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0


# ---- request goodput: wrong ------------------------------------------------------------
def strict(ttft, tpot, ttft_slo, tpot_slo):
    return (ttft_slo is None or ttft < ttft_slo) and (tpot_slo is None or tpot < tpot_slo)


def skips_one_token_requests(tl, ttft_slo, tpot_slo):
    n = sum(good(r.t_first_token - r.arrival, tpot_guarded(r), ttft_slo, tpot_slo)
            for r in tl.requests if r.output_len > 1)
    return n / span(tl)


def attainment_not_rate(tl, ttft_slo, tpot_slo):
    return slo_attainment(tl, ttft_slo, tpot_slo)


def good_tokens_per_second(tl, ttft_slo, tpot_slo):
    return sum(r.output_len for r in tl.requests
               if good(r.t_first_token - r.arrival, tpot_guarded(r), ttft_slo, tpot_slo)) / span(tl)


WRONG_REQUEST = {
    "no one-token guard": goodput_with(lambda r: (r.t_finished - r.t_first_token) / (r.output_len - 1)),
    "one-token TPOT infinite": goodput_with(
        lambda r: (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else float("inf")),
    "TPOT over output_len": goodput_with(lambda r: (r.t_finished - r.t_first_token) / r.output_len),
    "TPOT from arrival": goodput_with(lambda r: (r.t_finished - r.arrival) / r.output_len),
    "TTFT without queueing": goodput_with(tpot_guarded, ttft_of=lambda r: r.t_first_token - r.t_scheduled),
    "span from zero": goodput_with(tpot_guarded, span_of=lambda tl: max(s.t_end for s in tl.steps)),
    "span from the last arrival": goodput_with(
        tpot_guarded, span_of=lambda tl: max(r.t_finished for r in tl.requests) - max(r.arrival for r in tl.requests)),
    "strict limits": goodput_with(tpot_guarded, compare=strict),
    "skips one-token requests": skips_one_token_requests,
    "attainment, not a rate": attainment_not_rate,
    "good tokens per second": good_tokens_per_second,
    "crashes on None": goodput_with(tpot_guarded, compare=lambda a, b, c, d: a <= c and b <= d),
}


# ---- request goodput: right, written differently ----------------------------------------
def from_token_times(tl, ttft_slo, tpot_slo):
    start = min(r.arrival for r in tl.requests)
    end = max(step.t_end for step in tl.steps)
    count = 0
    for r in tl.requests:
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
        tpot = sum(gaps) / len(gaps) if gaps else 0.0
        ttft = r.token_times[0] - r.arrival
        count += (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)
    return count / (end - start)


def with_pandas(tl, ttft_slo, tpot_slo):
    df = requests_df(tl)
    ttft = df.t_first_token - df.arrival
    tpot = ((df.t_finished - df.t_first_token) / (df.output_len - 1).clip(lower=1)).where(df.output_len > 1, 0.0)
    ok = (ttft <= (ttft_slo if ttft_slo is not None else float("inf"))) & \
         (tpot <= (tpot_slo if tpot_slo is not None else float("inf")))
    return float(ok.sum()) / span(tl)


def via_minilm(tl, ttft_slo, tpot_slo):
    return request_goodput(tl, ttft_slo, tpot_slo)


RIGHT_REQUEST = {"guarded": goodput_with(tpot_guarded), "from token times": from_token_times,
                 "span to the last finish": goodput_with(tpot_guarded, span_of=lambda tl: max(
                     r.t_finished for r in tl.requests) - min(r.arrival for r in tl.requests)),
                 "pandas": with_pandas, "minilm.metrics": via_minilm}


@pytest.mark.parametrize("fn", WRONG_REQUEST.values(), ids=WRONG_REQUEST.keys())
def test_request_goodput_check_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_request_goodput(fn)


@pytest.mark.parametrize("fn", RIGHT_REQUEST.values(), ids=RIGHT_REQUEST.keys())
def test_request_goodput_check_accepts(fn, capsys):
    checks.check_request_goodput(fn)
    assert "passed:" in capsys.readouterr().out


# ---- DistServe's goodput ----------------------------------------------------------------
def attainment(tl, ttft_slo, tpot_slo):
    return slo_attainment(tl, ttft_slo, tpot_slo)


WRONG_DISTSERVE = {
    "best request goodput": lambda runs, a, b, target=0.9: max(request_goodput(tl, a, b) for tl in runs.values()),
    "first rate that misses": lambda runs, a, b, target=0.9: min(
        (r for r, tl in runs.items() if attainment(tl, a, b) < target), default=0.0),
    "strictly above the target": lambda runs, a, b, target=0.9: max(
        (r for r, tl in runs.items() if attainment(tl, a, b) > target), default=0.0),
    "target ignored": lambda runs, a, b, target=0.9: max(
        (r for r, tl in runs.items() if attainment(tl, a, b) >= 0.9), default=0.0),
    "None when no rate keeps it": lambda runs, a, b, target=0.9: max(
        (r for r, tl in runs.items() if attainment(tl, a, b) >= target), default=None),
    "last in the dict's order": lambda runs, a, b, target=0.9: next(
        (r for r, tl in reversed(runs.items()) if attainment(tl, a, b) >= target), 0.0),
    "rate times attainment": lambda runs, a, b, target=0.9: max(r * attainment(tl, a, b) for r, tl in runs.items()),
}


def conservative(runs, ttft_slo, tpot_slo, target=0.9):
    """Stops at the first rate that misses: the same answer wherever attainment falls with rate."""
    best = 0.0
    for rate in sorted(runs):
        if attainment(runs[rate], ttft_slo, tpot_slo) < target:
            break
        best = rate
    return best


def descending(runs, ttft_slo, tpot_slo, target=0.9):
    for rate in sorted(runs, reverse=True):
        met = [checks_meets(r, ttft_slo, tpot_slo) for r in runs[rate].requests]
        if sum(met) >= target * len(met):
            return rate
    return 0.0


def checks_meets(r, ttft_slo, tpot_slo):
    from minilm.metrics import meets_slo
    return meets_slo(r, ttft_slo, tpot_slo)


RIGHT_DISTSERVE = {"minilm.metrics": distserve_goodput, "stops at the first miss": conservative,
                   "highest first": descending}


@pytest.mark.parametrize("fn", WRONG_DISTSERVE.values(), ids=WRONG_DISTSERVE.keys())
def test_distserve_check_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_distserve_goodput(fn)


@pytest.mark.parametrize("fn", RIGHT_DISTSERVE.values(), ids=RIGHT_DISTSERVE.keys())
def test_distserve_check_accepts(fn, capsys):
    checks.check_distserve_goodput(fn)
    assert "passed:" in capsys.readouterr().out


# ---- the metrics themselves ---------------------------------------------------------------
def test_metrics_goodputs_on_the_handmade_run():
    tl = checks.handmade_timeline(checks.HANDMADE, end=2.5)
    for slos, want, _ in checks.GOODPUT_CASES:
        assert request_goodput(tl, *slos) == pytest.approx(want)
    assert summarize(tl, 0.5, 0.125)["goodput_req_per_s"] == pytest.approx(1.5)
    assert summarize(tl, 0.5, 0.125)["slo_attainment"] == pytest.approx(0.75)
    runs = checks.attainment_runs({1.0: 10, 2.0: 9, 4.0: 8})
    assert distserve_goodput(runs, 0.5, None, 0.9) == 2.0
    assert distserve_goodput(runs, 0.5, None, 1.0) == 1.0
    assert distserve_goodput(checks.attainment_runs({1.0: 0}), 0.5, None) == 0.0
