# %% [markdown]
# # Exercise 7 · The SLO a run can promise, SLOs per percentile, which rates to run, and how many seats
#
# A request meets the SLOs when its time to first token (TTFT: first token minus arrival,
# its time in the queue included) is at most `ttft_slo` and its time per output token
# (TPOT: the average gap between its tokens after the first) is at most `tpot_slo`; a
# limit of `None` means no limit.
#
# ## Part 1: the SLO a run can promise
#
# **Warm-up (not graded).** Write `meets_slo(record, ttft_slo, tpot_slo)` for one
# `RequestRecord` (fields `arrival`, `t_first_token`, `t_finished`, `output_len`,
# `token_times`, `finish_reason`). Think about every kind of request a run can hold: what is
# the TPOT of a request that produced a single token? And a request aborted before its first
# token (`t_first_token` is `None`, `output_len` is `0`)? A request aborted *after* its first
# token (the user closed the stream) is judged like any other on what it produced, its TTFT
# and the TPOT of the tokens it got. `minilm/metrics.py` has its own `meets_slo`: compare
# yours with it when you are done; no check grades this one.
#
# The engine computes request goodput and SLO attainment from `meets_slo`
# (`minilm/metrics.py`, lesson 7): given limits, how many requests met them. A service
# asks the question the other way round: with this deployment at this load, **what TTFT
# can we promise?** Write `tightest_ttft_slo(timeline, tpot_slo, target)`: the smallest
# TTFT limit with which at least a share `target` (`0 < target <= 1`) of the run's
# requests meet both limits (`tpot_slo` as given, `None` for none), or `None` if no TTFT
# limit is enough. The engine has no such function; the check compares yours with a
# reference in `labs/checks.py` on hand-made runs and a simulated one.
#
# Decide first: among which values can the answer lie? Which requests can never count,
# whatever the TTFT limit, and do they still count in the share's denominator? With `5`
# requests and `target = 0.75`, how many must meet the limits?

# %%
from labs import checks


def meets_slo(r, ttft_slo: float | None, tpot_slo: float | None) -> bool:
    # BEGIN SOLUTION
    if r.t_first_token is None:  # aborted before it produced a token: it kept no promise
        return False
    ttft = r.t_first_token - r.arrival
    # one token: no gap to average, so no TPOT limit can fail it (vLLM's benchmark counts 0)
    tpot = (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0
    return (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)
    # END SOLUTION


def tightest_ttft_slo(timeline, tpot_slo: float | None, target: float) -> float | None:
    # BEGIN SOLUTION
    # a request counts under a TTFT limit L if it meets the TPOT limit and its TTFT <= L: the
    # answer is one of those TTFTs, the k-th smallest, k the fewest requests whose share of ALL
    # the run's requests (aborted ones too) reaches the target
    n = len(timeline.requests)
    ttfts = sorted(r.t_first_token - r.arrival for r in timeline.requests if meets_slo(r, None, tpot_slo))
    for k, ttft in enumerate(ttfts, start=1):
        if k / n >= target:
            return ttft
    return None
    # END SOLUTION

# %%
# exercise check
checks.check_tightest_ttft_slo(tightest_ttft_slo)

# %% [markdown]
# ## Part 2: SLOs on percentiles
#
# Lesson 7's DistServe goodput counts the requests that meet *both* limits and asks for a
# target share of them. Benchmarks often state SLOs per metric instead, on a percentile:
# MLPerf Inference's server scenario for Llama 2 70B asks for a TTFT p99 within `2 s`
# and a TPOT p99 within `200 ms`, each on its own.
#
# Write `percentile_goodput(runs_by_rate, ttft_slo, tpot_slo, target)`. `runs_by_rate` maps
# a request rate (requests per second) to the timeline of a run at that rate. A run
# **keeps** the SLOs when at least a share `target` of its requests have a TTFT within
# `ttft_slo` (a request with no first token misses it), **and** at least a share `target`
# of its requests *that have a TPOT* (more than one output token) have a TPOT within
# `tpot_slo` — each limit counted on its own. (That is the `target` percentile of each
# metric within its limit, taking the percentile as the value at that rank.) A limit of
# `None` is no limit: nothing can miss it, not even a request that never got a first
# token. A request that failed (`r.failed`: its stream broke, lesson 9) after some tokens is
# judged on what it produced, like any other. Return the highest rate whose run keeps the
# SLOs, `0.0` when none does. The engine has no such
# function: the check compares yours with a reference in `labs/checks.py`.
#
# Before you code: a run where each limit is met by `7` of `8` requests, but only `6` of
# them meet both — does it keep a target of `0.875`? Does it in DistServe's sense?

# %%
def percentile_goodput(runs_by_rate: dict, ttft_slo: float | None, tpot_slo: float | None,
                       target: float) -> float:
    # BEGIN SOLUTION
    def keeps(tl) -> bool:
        if ttft_slo is not None:
            met = sum(r.t_first_token is not None and r.t_first_token - r.arrival <= ttft_slo for r in tl.requests)
            if met < target * len(tl.requests):
                return False
        if tpot_slo is not None:
            with_tpot = [r for r in tl.requests if r.output_len > 1]
            met = sum((r.t_finished - r.t_first_token) / (r.output_len - 1) <= tpot_slo for r in with_tpot)
            if met < target * len(with_tpot):
                return False
        return True

    return max((rate for rate, tl in runs_by_rate.items() if keeps(tl)), default=0.0)
    # END SOLUTION

# %%
# exercise check
checks.check_percentile_goodput(percentile_goodput)

# %% [markdown]
# ## Part 3: which rates to run
#
# `distserve_goodput` (in `minilm/metrics.py`) and your `percentile_goodput` take runs that were
# already made. On real hardware each run is a benchmark of minutes, so a service searches:
# it picks which rates to run. Write `goodput_search(run_at, rates, ttft_slo, tpot_slo,
# target)`: `rates` is a list of candidate request rates in rising order (maybe empty), and
# `run_at(rate)` runs the deployment at one of them and returns its `Timeline`. A run keeps
# the target when its SLO attainment (`slo_attainment` in `minilm/metrics.py`: the share of
# its requests that meet both limits) is at least `target`. You may assume that when the run
# at a rate keeps the target, the runs at every lower rate do too.
#
# Return the highest rate of `rates` whose run keeps the target, `0.0` when none does (no
# rates included), calling `run_at` **at most `ceil(log2(len(rates) + 1))` times**: `4` runs
# for `10` rates, `0` for none; running one rate twice counts twice. The check hands you
# `run_at`s on hand-made runs, counts your calls, and tries every place the boundary can be,
# at every end, for `1`, `2`, `3`, `7`, `8` and `10` rates.

# %%
import math

from minilm.metrics import slo_attainment


def goodput_search(run_at, rates: list[float], ttft_slo: float | None, tpot_slo: float | None,
                   target: float) -> float:
    # BEGIN SOLUTION
    # The answer is one of len(rates) + 1 outcomes: how many of the lowest rates keep the target.
    # Keep it within [lo, hi] and halve that with each run: ceil(log2(n + 1)) runs at most.
    lo, hi = 0, len(rates)
    while lo < hi:
        mid = (lo + hi + 1) // 2  # if rates[mid - 1] keeps the target, at least mid rates do
        if slo_attainment(run_at(rates[mid - 1]), ttft_slo, tpot_slo) >= target:
            lo = mid
        else:
            hi = mid - 1
    return rates[lo - 1] if lo else 0.0
    # END SOLUTION

# %%
# exercise check
checks.check_goodput_search(goodput_search)

# %% [markdown]
# ## Part 4: how many seats (design)
#
# At one request rate, the number of seats (`max_num_seqs`) decides who waits: too few and
# requests queue (TTFT), too many and every decode step carries more prompts (TPOT). Write
# `best_seats(run_with, seats, ttft_slo, tpot_slo)`: `seats` is a list of candidate
# `max_num_seqs` in rising order (at least one), `run_with(s)` runs the deployment at the fixed
# rate with `max_num_seqs=s` and returns its `Timeline`. Return the candidate whose run has the
# highest SLO attainment (`slo_attainment`), the smallest of them on a tie, calling `run_with`
# **at most `ceil(log_phi(len(seats)))` times**, `phi = (1 + sqrt(5)) / 2`: `0` runs for one
# candidate, `2` for two, `3` for four, `5` for nine or ten; running one candidate twice counts
# twice.
#
# You may assume what the check's runs satisfy: over the candidates, in order, the attainment
# rises strictly to its highest, may stay at that value over neighbouring candidates, then
# falls strictly (either side may be empty). The check counts your calls on hand-made runs with
# the highest at every place, level over one to three candidates, for up to `20` candidates,
# and on real simulated runs: `300` requests at `300` req/s on one simulated H100, for
# `9` candidates from `8` to `256` seats, at three pairs of limits.


# %%
def best_seats(run_with, seats: list[int], ttft_slo: float | None, tpot_slo: float | None) -> int:
    # BEGIN SOLUTION
    # Fibonacci search. Pad the candidates to F(k) - 1 places (a padded place attains -inf: the
    # curve still falls there). Two probes at F(k-2) - 1 and F(k-1) - 1 past lo leave F(k-1) - 1
    # places holding the answer, with one probe already inside at its own F(k-3) - 1 or
    # F(k-2) - 1: one new run a round.
    known: dict[int, float] = {}

    def attainment(i: int) -> float:
        if i >= len(seats):
            return -math.inf
        if i not in known:
            known[i] = slo_attainment(run_with(seats[i]), ttft_slo, tpot_slo)
        return known[i]

    fib = [1, 1]
    while fib[-1] - 1 < len(seats):
        fib.append(fib[-1] + fib[-2])
    k, lo = len(fib) - 1, 0  # the answer is among lo .. lo + fib[k] - 2
    while fib[k] - 1 > 1:
        a, b = lo + fib[k - 2] - 1, lo + fib[k - 1] - 1
        if attainment(a) < attainment(b):
            lo = a + 1  # the highest lies past a
        # else: not at b or past it (on a tie: b is past the first of the highest, or past the top)
        k -= 1
    return seats[lo]
    # END SOLUTION


# %%
# exercise check
checks.check_best_seats(best_seats)

# %% [markdown]
# **Think further (no check).** Rerun lesson 7's sweep with per-percentile SLOs at a `p90`
# target and compare with its DistServe goodput: which setting gains, which loses, and
# why? A `p99` needs enough requests to mean anything: in a run of `60` requests, how
# many may miss a limit before the `p99` does? How long must a benchmark run for its
# `p99` to rest on more than one request?

# %% [markdown]
# <details><summary>Hint for Part 3 (open it if you are stuck)</summary>
#
# Count the possible answers before you count runs: with `n` rates, how many are there, and
# how many can one run tell apart? Then, which rate's run tells you the most, and what does
# its outcome rule out? Mind what you already know about the ends before you spend a run on
# one.
#
# </details>

# %% [markdown]
# <details><summary>Hint for Part 4 (open it if you are stuck)</summary>
#
# Two runs at neighbouring candidates tell you which side of them the highest lies on; two runs
# farther apart rule out more, and one of them is still inside what is left. How many candidates
# can `k` runs settle, if every run after the first two is one new one? Where must the two first
# runs be for that? Mind a tie between two runs: which side can the first of the highest be on?
#
# </details>
