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
    tried: dict[float, float] = {}

    def holds(rate: float) -> bool:
        tried[rate] = slo_attainment(run_at(rate), ttft_slo, tpot_slo)
        return tried[rate] >= target

    if not holds(low):
        return Goodput(0.0, tried)
    ok, bad = low, min(low * 2, high)
    while ok < high and len(tried) < max_runs and holds(bad):
        ok, bad = bad, min(bad * 2, high)
    if ok >= high:
        return Goodput(ok, tried)
    while bad - ok > rel_tol * ok and len(tried) < max_runs:
        mid = (ok + bad) / 2
        ok, bad = (mid, bad) if holds(mid) else (ok, mid)
    return Goodput(ok, tried)
