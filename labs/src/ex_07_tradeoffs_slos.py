# %% [markdown]
# # Exercise 7 · Goodput
#
# Throughput counts every request; **goodput** counts only the requests that met the
# service-level objectives (DistServe's definition): time to first token
# `t_first_token - arrival <= ttft_slo` and time per output token
# `(t_finished - t_first_token) / (output_len - 1) <= tpot_slo` (a request with one output
# token has TPOT 0). An SLO of `None` means no limit. Goodput is those requests divided by
# the run's span: from the first arrival to the end of the last step.
#
# Write `goodput(timeline, ttft_slo, tpot_slo)` in requests per second, from
# `timeline.requests` (`RequestRecord`s) and `timeline.steps`.

# %%
from labs import checks


def goodput(timeline, ttft_slo: float | None, tpot_slo: float | None) -> float:
    # BEGIN SOLUTION
    span = max(s.t_end for s in timeline.steps) - min(r.arrival for r in timeline.requests)
    good = 0
    for r in timeline.requests:
        ttft = r.t_first_token - r.arrival
        tpot = (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0
        if (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo):
            good += 1
    return good / span
    # END SOLUTION

# %%
# exercise check
checks.check_goodput(goodput)
