# %% [markdown]
# # Exercise 7 · Goodput, two ways
#
# Two different numbers go by the name *goodput* (lesson 7 shows both):
#
# - **request goodput** (what `vllm bench serve --goodput` reports): of one run, the
#   requests that met every service-level objective, per second of the run;
# - **DistServe's goodput** (Zhong et al., OSDI 2024): the highest request rate at which a
#   deployment still keeps a target share of its requests (`target=0.9`) within the SLOs. One
#   run cannot tell it; runs at several rates can.
#
# A request meets the SLOs when its time to first token (TTFT) is at most `ttft_slo` and
# its time per output token (TPOT: the average gap between its tokens after the first) is
# at most `tpot_slo`; a limit of `None` means no limit. A run's span is from its first
# arrival to the end of its last step.
#
# ## Part 1: request goodput of one run
#
# Write `meets_slo(record, ttft_slo, tpot_slo)` for one `RequestRecord` (fields
# `arrival`, `t_first_token`, `t_finished`, `output_len`, `token_times`), then
# `request_goodput(timeline, ttft_slo, tpot_slo)` in requests per second from
# `timeline.requests` and `timeline.steps`. Think about every kind of request the engine
# can finish: what is the TPOT of a request that produced a single token?

# %%
from labs import checks


def meets_slo(r, ttft_slo: float | None, tpot_slo: float | None) -> bool:
    # BEGIN SOLUTION
    ttft = r.t_first_token - r.arrival
    # one token: no gap to average, so no TPOT limit can fail it (vLLM's benchmark counts 0)
    tpot = (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0
    return (ttft_slo is None or ttft <= ttft_slo) and (tpot_slo is None or tpot <= tpot_slo)
    # END SOLUTION


def request_goodput(timeline, ttft_slo: float | None, tpot_slo: float | None) -> float:
    # BEGIN SOLUTION
    span = max(s.t_end for s in timeline.steps) - min(r.arrival for r in timeline.requests)
    return sum(meets_slo(r, ttft_slo, tpot_slo) for r in timeline.requests) / span
    # END SOLUTION

# %%
# exercise check
checks.check_request_goodput(request_goodput)

# %% [markdown]
# ## Part 2: DistServe's goodput from a rate sweep
#
# `runs_by_rate` maps a request rate (requests per second) to the timeline of a run of
# the same deployment at that rate. Write `distserve_goodput(runs_by_rate, ttft_slo,
# tpot_slo, target)`: the goodput in DistServe's sense, in requests per second, `0.0`
# when no run kept the target. Before you code: is it one of the runs' request goodputs?
# Why can it be far above every one of them?

# %%
def distserve_goodput(runs_by_rate: dict, ttft_slo: float | None, tpot_slo: float | None,
                      target: float = 0.9) -> float:
    # BEGIN SOLUTION
    kept = [rate for rate, tl in runs_by_rate.items()
            if sum(meets_slo(r, ttft_slo, tpot_slo) for r in tl.requests) / len(tl.requests) >= target]
    return max(kept, default=0.0)
    # END SOLUTION

# %%
# exercise check
checks.check_distserve_goodput(distserve_goodput)
