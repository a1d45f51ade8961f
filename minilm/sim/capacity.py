"""Capacity by bisection: DistServe's goodput of a deployment, found by simulating it.

DistServe's goodput is the highest request rate at which at least `target` (90%) of the
requests meet both SLO limits (metrics.py says more; Zhong et al., OSDI 2024). `slo_goodput`
finds it as Vidur-Search finds a capacity: double the rate until the SLOs fail, then bisect
between the last rate that held and the first that did not. It trusts that attainment falls
as the rate rises; every rate it tried and its attainment come back with the answer, so a
reader can see whether it did.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..metrics import slo_attainment
from ..timeline import Timeline


@dataclass
class Goodput:
    rate: float  # requests/s: the highest rate tried that held the SLOs (0.0: not even `low`)
    tried: dict[float, float]  # every rate tried -> its SLO attainment


def slo_goodput(
    run_at: Callable[[float], Timeline],
    ttft_slo: float | None,
    tpot_slo: float | None,
    target: float = 0.9,
    low: float = 1.0,
    rel_tol: float = 0.05,
    max_runs: int = 24,
    high: float = math.inf,
) -> Goodput:
    """`run_at(rate)` runs the deployment at `rate` requests/s and returns its timeline; the
    answer is within `rel_tol` of the true boundary (or the best found in `max_runs` runs).
    Doubling stops at `high`: a deployment that holds there gets `high` (at least that much;
    a run of a fixed number of requests at a rate high enough is one burst, which may hold)."""
    return bisect_rate(
        lambda rate: slo_attainment(run_at(rate), ttft_slo, tpot_slo),
        target, low, rel_tol, max_runs, high,
    )  # fmt: skip


def bisect_rate(
    attainment_at: Callable[[float], float],
    target: float = 0.9,
    low: float = 1.0,
    rel_tol: float = 0.05,
    max_runs: int = 24,
    high: float = math.inf,
    guess: float | None = None,
) -> Goodput:
    """`slo_goodput` on `attainment_at(rate)` (a run's SLO attainment, or a bound of it on the
    right side of `target`). Without a `guess`: doubling from `low` until a rate fails, then
    bisection. With one (the search's estimate from the cost model): the first rate tried is
    the guess, then steps away from it of rel_tol, doubling each time, until the boundary
    lies between two rates tried (never below `low`, never above `high`), then the same
    bisection: the same tolerance, fewer runs when the guess is close."""
    tried: dict[float, float] = {}

    def holds(rate: float) -> bool:
        tried[rate] = attainment_at(rate)
        return tried[rate] >= target

    if guess is None:
        if not holds(low):
            return Goodput(0.0, tried)
        ok, bad = low, min(low * 2, high)
        while ok < high and len(tried) < max_runs and holds(bad):
            ok, bad = bad, min(bad * 2, high)
    else:
        step, rate = rel_tol, min(max(guess, low), high)
        if holds(rate):
            ok, bad = rate, min(rate * (1 + step), high)
            while ok < high and len(tried) < max_runs and holds(bad):
                ok, bad, step = bad, min(bad * (1 + 2 * step), high), 2 * step
        else:
            bad = rate
            while bad > low:  # down to `low` at most: it ends however far off the guess was
                ok = max(bad / (1 + step), low)
                if holds(ok):
                    break
                bad, step = ok, 2 * step
            else:
                return Goodput(0.0, tried)  # not even `low` held
    if ok >= high:
        return Goodput(ok, tried)
    while bad - ok > rel_tol * ok and len(tried) < max_runs:
        mid = (ok + bad) / 2
        ok, bad = (mid, bad) if holds(mid) else (ok, mid)
    return Goodput(ok, tried)
