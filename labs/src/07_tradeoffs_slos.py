# %% [markdown]
# # 7 · Trade-offs and SLOs
#
# A serving engine is tuned against a promise to its users, a **service-level
# objective (SLO)**: a limit on the time to first token (TTFT) and on the time per output
# token after it (TPOT). Throughput that breaks the promise is worth little, hence
# **goodput**: what a deployment serves *within* the SLO. This lesson sweeps the batch
# size, measures goodput in both of the senses the name is used in, and tests source
# `000`'s four misconceptions about in-flight batching with an experiment each. Lesson 7b
# takes the same measurements to the questions around a deployment: how many GPUs, which
# GPU, what a token costs, the sources' risks, and what came after.
#
# Everything here is **simulated** (Llama-3-8B in bfloat16, cost model of
# `minilm/sim/costmodel.py`): the same scheduler as the real engine, step times predicted,
# identical on every machine.

# %%
import functools

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm import RequestSpec, make_workload, summarize
from minilm.sim import simulated_engine, vllm_default_budget
from labs.prose import check, say
import widgets

def simulate(specs, policy="continuous", device="h100", **knobs):
    """A simulated run; chunked prefill gets vLLM's default budget on `device` unless one is given
    (the lab's own default, 256, is sized for its tiny models on a CPU: lesson 6)."""
    if policy == "chunked" and knobs.get("max_num_batched_tokens") is None:
        knobs["max_num_batched_tokens"] = vllm_default_budget(device)
    engine = simulated_engine("llama-3-8b", device, policy=policy, record_kv_blocks=False, **knobs)  # no KV maps here
    engine.add_workload(specs)
    return engine.run()

# Seconds: the promise used in this lesson. MLPerf Inference's interactive Llama-3.1-8B scenario asks
# for TTFT 500 ms and TPOT 30 ms (loadgen/mlperf.conf); this TPOT limit is half of theirs, tight enough
# that the batch size decides whether it holds on an H100 (section 1: TPOT at full batches).
TTFT_SLO, TPOT_SLO = 0.5, 0.015

# %%
# NBVAL_CHECK_OUTPUT
say(f"The SLO in this lesson: TTFT ≤ **{TTFT_SLO} s** and TPOT ≤ **{TPOT_SLO * 1e3:.0f} ms** (on average, a "
    f"token every {TPOT_SLO * 1e3:.0f} ms or faster once the first has come).")

# %% [markdown]
# ## 1. Throughput against latency
#
# The knob is `max_num_seqs`, the most requests in flight. First, what each setting can
# do at most, its **capacity**: give it a queue that never runs dry (thousands of
# requests, all waiting at the start) and measure its pace while requests still wait.
# Once the queue is empty, the last long answers finish in an emptying batch; that tail
# is not the GPU's pace, so it is left out.

# %%
# NBVAL_CHECK_OUTPUT
sizes = [32, 64, 128, 256]
queue = make_workload("mixed", num_requests=3000, seed=0, vocab_size=128256)  # all waiting at t = 0
MEAN_OUT = sum(s.max_tokens for s in queue) / len(queue)  # the simulator runs every request to its max_tokens

def pace(tl):
    """Output tokens per second until the queue ran dry: the GPU never short of work."""
    t_end = max(s.t_end for s in tl.steps if s.num_waiting > 0)
    return sum(t <= t_end for r in tl.requests for t in r.token_times) / t_end

rows = []
for n in sizes:
    tl = simulate(queue, max_num_seqs=n)
    rows.append({**summarize(tl), "output_tok_per_s": pace(tl), "knob": "max_num_seqs", "value": n})
capacity = pd.DataFrame(rows).set_index("value", drop=False)
print(f"{len(queue)} `mixed` requests, all queued (mean {MEAN_OUT:.1f} output tokens); H100, simulated")
for n, m in capacity.iterrows():
    print(f"max_num_seqs {n:3d}: {m.output_tok_per_s:6,.0f} output tok/s = {m.output_tok_per_s / MEAN_OUT:4.0f} "
          f"req/s, TPOT p50 {m.tpot_p50 * 1e3:5.2f} ms")

# %%
# NBVAL_CHECK_OUTPUT
tok, tpot = capacity.output_tok_per_s, capacity.tpot_p50
assert tok.is_monotonic_increasing and tpot.is_monotonic_increasing  # the sentence below
say(f"From `max_num_seqs={sizes[0]}` to `{sizes[-1]}`, throughput rises {tok.iloc[-1] / tok.iloc[0]:.1f}x "
    f"({tok.iloc[0]:,.0f} → {tok.iloc[-1]:,.0f} tok/s), and TPOT from {tpot.iloc[0] * 1e3:.2f} to "
    f"{tpot.iloc[-1] * 1e3:.2f} ms.")

# %% [stored]
widgets.sweep_figure(capacity, latency="tpot_p50")  # x: the pace while queued

# %% [markdown]
# More requests in flight means more tokens per step, so throughput rises — and each
# step is longer, so every request's tokens come more slowly (TPOT up).
#
# ### A steady load
#
# Users send a stream, not a queue. A stream of requests asks the GPU for (request rate)
# × (mean output tokens) tokens per second; a setting that cannot serve that many keeps
# a queue that grows for as long as the stream lasts. For a stream to be a steady load and
# not a burst that ends before the queue matters, its arrivals must last many request
# lifetimes. Each setting, under one stream; whether it keeps up is read off the run: the
# tokens it served while requests were still arriving, and the queue it had when the
# last one arrived:

# %%
# NBVAL_CHECK_OUTPUT
SECONDS = 30  # of arrivals, in every steady-load run of this lesson

@functools.cache  # section 2 judges the same runs
def steady(rate, n, policy="continuous"):
    """`rate` `mixed` requests per second arriving for SECONDS (at least 300 requests), at max_num_seqs=n."""
    specs = make_workload("mixed", num_requests=max(300, int(rate * SECONDS)), seed=0, rate=rate, vocab_size=128256)
    return simulate(specs, policy, max_num_seqs=n)

def while_arriving(tl):
    """(output tok/s served until the last arrival, requests waiting at the last arrival)."""
    last = max(r.arrival for r in tl.requests)
    served = sum(t <= last for r in tl.requests for t in r.token_times)
    return served / last, next(s.num_waiting for s in tl.steps if s.t_end >= last)

RATE = 90.0  # requests per second
need = RATE * MEAN_OUT
print(f"{RATE:.0f} req/s × {MEAN_OUT:.1f} output tokens = {need:,.0f} output tok/s asked, for {SECONDS} s")
keeps_up = {}
for n in sizes:
    tl = steady(RATE, n)
    m, (served, waiting) = summarize(tl), while_arriving(tl)
    keeps_up[n] = waiting < n  # the queue at the end is less than one batch: it did not grow
    print(f"max_num_seqs {n:3d}: served {served:6,.0f} tok/s while requests arrived, {waiting:5d} waiting at the "
          f"last arrival; TTFT p50 {m['ttft_p50'] * 1e3:7.0f} ms, p99 {m['ttft_p99'] * 1e3:7.0f} ms, "
          f"TPOT p50 {m['tpot_p50'] * 1e3:5.2f} ms")

# %%
# NBVAL_CHECK_OUTPUT
kept = summarize(steady(RATE, sizes[-1]))
lifetime = max(r.t_finished - r.arrival for r in steady(RATE, sizes[-1]).requests)
slow = [n for n in sizes if not keeps_up[n]]
assert slow and slow != sizes and SECONDS > 4 * lifetime  # the sentence below
assert all(capacity.output_tok_per_s[n] < need for n in slow)  # section 1's capacities agree
assert all(summarize(steady(RATE, n))["ttft_p99"] < 0.1 for n in sizes if n not in slow)
say(f"The arrivals last {SECONDS} s: {SECONDS / lifetime:.1f} times the longest request's lifetime "
    f"({lifetime:.1f} s from arrival to last token, where the GPU keeps up), {SECONDS / kept['e2e_p50']:.0f} times "
    f"the median one: a steady load. Too few in flight (`max_num_seqs` {' and '.join(map(str, slow))}, whose "
    f"capacities in section 1 are below the {need:,.0f} tok/s asked) and the queue grows all run long, and TTFT "
    f"with it; a longer stream would make it worse still. With enough in flight, the queue stays short and TTFT "
    f"stays in milliseconds.")

# %% [markdown]
# ## 2. Goodput, two definitions
#
# The name is used for two different numbers; both are useful, and they answer
# different questions.
#
# > **Request goodput** — what `vllm bench serve --goodput` reports: of one benchmark
# > run, the requests that met every SLO, per second of the run. **DistServe's goodput**
# > (Zhong et al., OSDI 2024, the paper that popularised the term for LLM serving): the
# > highest request rate a deployment can take while a target share of requests (their
# > example: 90%) still meets the SLOs.
#
# ### 2a. Request goodput of one run
#
# The steady-load runs of section 1, judged against the SLO (`minilm.metrics.request_goodput`):

# %%
# NBVAL_CHECK_OUTPUT
from minilm.metrics import distserve_goodput, meets_slo, request_goodput, run_span, slo_attainment

rows = []
for n in sizes:
    tl = steady(RATE, n)
    rows.append((n, summarize(tl)["output_tok_per_s"], slo_attainment(tl, TTFT_SLO, TPOT_SLO),
                 request_goodput(tl, TTFT_SLO, TPOT_SLO)))
    print(f"max_num_seqs {n:3d}: {rows[-1][1]:6,.0f} tok/s over the run's span, {rows[-1][2]:4.0%} of requests "
          f"within the SLO, request goodput {rows[-1][3]:5.1f} req/s")

# %%
# NBVAL_CHECK_OUTPUT
best = max(rows, key=lambda r: r[3])
late = rows[sizes.index(64)]
assert late[3] / best[3] < (late[1] / best[1]) / 4  # the sentence below
say(f"`max_num_seqs=64` delivers {late[1] / best[1]:.0%} of the throughput of `max_num_seqs={best[0]}` but "
    f"{late[3] / best[3]:.0%} of its request goodput: throughput counts every token, also those that came too "
    f"late to keep the promise.")

# %% [stored]
fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput (output tok/s)", "request goodput (req/s)"))
fig.add_bar(x=[str(r[0]) for r in rows], y=[r[1] for r in rows], name="throughput", row=1, col=1)
fig.add_bar(x=[str(r[0]) for r in rows], y=[r[3] for r in rows], name="request goodput", row=1, col=2)
fig.update_xaxes(title_text="max_num_seqs")
fig.update_layout(height=330, showlegend=False, title="the same runs, two yardsticks (H100, simulated)")
fig

# %% [markdown]
# The setting with a lot of throughput is not necessarily one that keeps the promises.
#
# Both yardsticks share a catch: their denominator. A run's span lasts from the first
# arrival until its last answer ends, and the last answers are the long ones, finishing
# in a batch that empties after the arrivals stop. (That is why the settings that keep up
# show fewer tokens per second over the span than the stream asked for, although they
# served all of it while it arrived.) The same deployment under the same load, in a long
# run and a short one:

# %%
# NBVAL_CHECK_OUTPUT
short = simulate(make_workload("mixed", num_requests=int(RATE * 2), seed=0, rate=RATE, vocab_size=128256),
                 max_num_seqs=best[0])
spans = {}
for name, tl in (("long", steady(RATE, best[0])), ("short", short)):
    last_arrival = max(r.arrival for r in tl.requests)  # the first is at 0
    draining = next(s.num_running for s in tl.steps if s.t_start >= last_arrival)
    last = max(tl.requests, key=lambda r: r.t_finished)
    spans[name] = (last_arrival, run_span(tl), request_goodput(tl, TTFT_SLO, TPOT_SLO))
    print(f"{name:5s} run: {len(tl.requests):4d} requests, {last_arrival:4.1f} s of arrivals, "
          f"span {spans[name][1]:4.1f} s, "
          f"{slo_attainment(tl, TTFT_SLO, TPOT_SLO):4.0%} within the SLO, request goodput {spans[name][2]:5.1f} req/s; "
          f"then {spans[name][1] - last_arrival:.1f} s draining {draining} requests in flight, until the last answer "
          f"({last.output_len} tokens) ends")

# %%
# NBVAL_CHECK_OUTPUT
(a_l, s_l, g_l), (a_s, s_s, g_s) = spans["long"], spans["short"]
assert (s_s - a_s) / s_s > 3 * (s_l - a_l) / s_l and g_s < g_l < RATE  # the sentence below
say(f"Same deployment, same {RATE:.0f} req/s: request goodput **{g_l:.0f} req/s** over {a_l:.0f} s of arrivals, "
    f"**{g_s:.0f} req/s** over {a_s:.0f} s. The span runs until the last answer ends, a long one: after the last "
    f"arrival the batch drains down to a few long answers. In the short run that tail is "
    f"{(s_s - a_s) / s_s:.0%} of the span, in the long one {(s_l - a_l) / s_l:.0%}. Request goodput never exceeds "
    f"the arrival rate, and it depends on how long the run is: it judges one run, at one load.")

# %% [markdown]
# ### 2b. DistServe's goodput: how much load a setting can take
#
# DistServe's question is about capacity: run the same deployment at rising request
# rates and find the highest at which the SLO attainment still reaches the target
# (`minilm.metrics.distserve_goodput`). Every run is a steady load as in section 1, and
# a sweep stops at the first rate that misses the target: more load would only miss it
# more. Static batching (lesson 2) joins the sweep, at rates of its own:

# %%
# NBVAL_CHECK_OUTPUT
TARGET = 0.9
sweeps = {("continuous", n): [float(r) for r in range(40, 160, 10)] for n in sizes}
sweeps["static", 128] = [0.25, 0.5, 1.0, 2.0]
attainment, goodput, missed = {}, {}, {}
for (policy, n), rates in sweeps.items():
    runs = {}
    for rate in rates:
        runs[rate] = steady(rate, n, policy)
        if slo_attainment(runs[rate], TTFT_SLO, TPOT_SLO) < TARGET:
            missed[policy, n] = runs[rate]  # the first rate it could not take
            break
    attainment[policy, n] = {rate: slo_attainment(tl, TTFT_SLO, TPOT_SLO) for rate, tl in runs.items()}
    goodput[policy, n] = distserve_goodput(runs, TTFT_SLO, TPOT_SLO, TARGET)
    tried = ", ".join(f"{a:4.0%} at {r:g}" for r, a in attainment[policy, n].items())
    print(f"{policy:10s} max_num_seqs {n:3d}: {tried}  -> DistServe goodput {goodput[policy, n]:g} req/s")

# %% [stored]
fig = go.Figure()
for (policy, n), by_rate in attainment.items():
    fig.add_scatter(x=list(by_rate), y=list(by_rate.values()), name=f"{policy}, max_num_seqs={n}",
                    mode="lines+markers")
fig.add_hline(y=TARGET, line_dash="dot", annotation_text=f"target {TARGET:.0%}")
fig.update_layout(xaxis_title="request rate (req/s, log)", xaxis_type="log",
                  yaxis_title="share of requests within the SLO", yaxis_tickformat=".0%", height=380,
                  title="SLO attainment against load (H100, simulated)")
fig

# %% [markdown]
# Read DistServe's goodput off the figure: the rightmost point of each line above the
# dotted target. Against section 1's capacities, and which promise each setting broke
# first:

# %%
# NBVAL_CHECK_OUTPUT
fails = {}
for (policy, n), tl in missed.items():
    rate = max(attainment[policy, n])
    fails[policy, n] = (sum(not meets_slo(r, TTFT_SLO, None) for r in tl.requests) / len(tl.requests),
                        sum(not meets_slo(r, None, TPOT_SLO) for r in tl.requests) / len(tl.requests),
                        max(s.num_running for s in tl.steps))
    can = f"capacity {capacity.output_tok_per_s[n] / MEAN_OUT:3.0f} req/s, " if policy == "continuous" else ""
    print(f"{policy:10s} max_num_seqs {n:3d}: {can}DistServe goodput {goodput[policy, n]:3g} req/s; at {rate:g} req/s, "
          f"{fails[policy, n][0]:4.0%} missed the TTFT limit, {fails[policy, n][1]:4.0%} the TPOT limit "
          f"(peak batch {fails[policy, n][2]:3d})")

# %%
# NBVAL_CHECK_OUTPUT
can = {n: capacity.output_tok_per_s[n] / MEAN_OUT for n in sizes}  # req/s each setting keeps up with
good = {n: goodput["continuous", n] for n in sizes}
step = sweeps["continuous", sizes[0]][1] - sweeps["continuous", sizes[0]][0]
small, n_big, big = sizes[:-1], sizes[-1], fails["continuous", sizes[-1]]
queued = [n for n in sizes if fails["continuous", n][0] > fails["continuous", n][1]]
assert queued == small and all(can[n] - step < good[n] <= can[n] for n in small)  # the sentences below
assert big[1] > big[0] == 0 and big[2] > small[-1]
assert good[n_big] - good[small[-1]] < (can[n_big] - can[small[-1]]) / 2 and good[n_big] < can[n_big] - 25
assert fails["static", 128][0] > fails["static", 128][1]
say(f"Goodput follows capacity while the cap is small: up to `max_num_seqs={small[-1]}`, each setting takes "
    f"the load it keeps up with, less than a sweep step ({step:.0f} req/s) short "
    f"({', '.join(f'{good[n]:.0f} of {can[n]:.0f}' for n in small)} req/s); past it, requests queue and miss the "
    f"TTFT limit. `max_num_seqs={n_big}` takes **{good[n_big]:.0f} req/s**, only {good[n_big] - good[small[-1]]:.0f} "
    f"more than `max_num_seqs={small[-1]}`, although it could keep up with {can[n_big]:.0f} req/s. At "
    f"{max(attainment['continuous', n_big]):.0f} req/s no request misses the TTFT limit, but when arrivals "
    f"bunch up it lets them all in, up to {big[2]} requests at once: those steps are longer, and {big[1]:.0%} miss "
    f"the TPOT limit (at a full batch its TPOT is {tpot[n_big] * 1e3:.1f} ms, section 1). Too few in flight, "
    f"requests queue (TTFT); too many, every token is slower (TPOT). Static batching takes "
    f"**{goodput['static', 128]:g} req/s**: a request that arrives while a batch runs waits for the batch's longest "
    f"answer, and misses the TTFT limit.")

# %% [markdown]
# Tighten or loosen the SLO in the first cell and watch both goodputs move. Exercise 7
# asks you to compute request goodput, and goodput under per-percentile SLOs.

# %% [markdown]
# ## 3. The sources' four misconceptions, four experiments
#
# Source `000` ends with four common misreadings of in-flight batching and corrects each.
# Each gets an experiment here.
#
# ### (1) "In-flight batching is traditional micro-batching"
#
# Micro-batching (pipeline parallelism, as in GPipe or PipeDream) cuts work into smaller
# batches to keep pipeline stages busy; each micro-batch is still formed once and runs to
# its end. In-flight batching is about *when* the batch changes — at every iteration — not
# about its size. On one GPU, micro-batching a batch (`max_num_seqs=128`) into four
# micro-batches (`32` each) that run in turn is static batching with `max_num_seqs=32`: each micro-batch is formed once, padded to
# its own longest row and run to its end before the next (in a pipeline, each stage runs
# them in the same way, one after another). So the rows below are micro-batching at
# three sizes, against in-flight batching at the micro-batch size:

# %%
# NBVAL_CHECK_OUTPUT
offline = make_workload("mixed", num_requests=200, seed=0, vocab_size=128256)  # for (3) and (4)
micro = {}
for policy, n in [("static", 8), ("static", 32), ("static", 128), ("continuous", 32)]:
    tl = simulate(queue[:1000], policy, max_num_seqs=n)  # section 1's queue: the pace while requests wait
    waiting = [s for s in tl.steps if s.num_waiting > 0]
    real = sum(len({i.request_id for i in s.items if i.kind in ("prefill", "decode")}) for s in waiting) / len(waiting)
    micro[f"{policy} {n}"] = pace(tl)
    print(f"{policy:10s} max_num_seqs {n:3d}: {pace(tl):6.0f} tok/s while requests wait, "
          f"padding {summarize(tl)['padding_fraction']:4.0%}, mean real batch {real:5.1f}")

# %%
# %%
# NBVAL_CHECK_OUTPUT
fixed = {k: v for k, v in micro.items() if k.startswith("static")}
assert micro["continuous 32"] > 2 * max(fixed.values())  # the sentence below
say(f"Simulated: fixed batches of any size, micro-batches included, reach at most **{max(fixed.values()):,.0f}** "
    f"tok/s ({max(fixed, key=fixed.get)}); in-flight batching with 32 seats, the micro-batch size, "
    f"**{micro['continuous 32']:,.0f}**, {micro['continuous 32'] / micro['static 32']:.1f}x the micro-batches of "
    f"the same size. Cutting a batch smaller does not recover what changing it at every step gains.")

# %%
fig = go.Figure(go.Bar(x=list(micro), y=list(micro.values()), marker_color=["#7f7f7f"] * 3 + ["#1f77b4"]))
fig.update_layout(xaxis_title="policy, max_num_seqs", yaxis_title="output tokens / s", height=320,
                  title="a full queue of `mixed` requests (H100, simulated)")
fig

# %% [markdown]
# > **Source 000, checked.** Micro-batching exists "to hide communication latency, the
# > batch size fixed at compile time" (为了掩盖通信延迟，批的大小在编译时确定).
# >
# > Imprecise: its main purpose is to keep every pipeline stage working at once (GPipe's
# > "bubble"); overlapping communication is a side benefit, and the size is a setting
# > chosen for the run, not fixed by a compiler. What matters holds: once formed, a
# > micro-batch does not change.

# %% [markdown]
# ### (2) "Continuous batching lowers a single request's latency"
#
# The source's correction: its gain is throughput, not the latency of one request, and
# filling the batch can *raise* inter-token latency. Half right, in three parts. Alone on
# the GPU, a request takes about the same time under every policy:

# %%
# NBVAL_CHECK_OUTPUT
alone = [RequestSpec("solo", [1] * 512, max_tokens=256)]
solo = {policy: simulate(alone, policy) for policy in ("static", "continuous", "chunked")}
for policy, tl in solo.items():
    r = tl.requests[0]
    print(f"{policy:10s}: alone, end-to-end {(r.t_finished - r.arrival) * 1e3:7.1f} ms")

# %%
# NBVAL_CHECK_OUTPUT
chunks = [i.num_tokens for s in solo["chunked"].steps for i in s.items if i.kind == "prefill"]
extra = solo["chunked"].requests[0].t_finished - solo["continuous"].requests[0].t_finished
say(f"Alone, chunking changes nothing here: under vLLM's default budget its {len(alone[0].prompt_ids)}-token prompt "
    f"runs as {len(chunks)} chunk ({chunks[0]} tokens), {extra * 1e3:.1f} ms later than without chunks."
    if len(chunks) == 1 else
    f"Chunking adds a hair alone: its {len(alone[0].prompt_ids)}-token prompt runs as {len(chunks)} chunks of "
    f"{chunks} tokens, {extra * 1e3:.1f} ms later.")

# %% [markdown]
# Under a light steady load that both policies keep up with (section 1's steady load
# would swamp static batching), the latency a user sees falls, and the *time per output
# token* follows the batch, not the policy:

# %%
# NBVAL_CHECK_OUTPUT
LIGHT = 10.0  # requests per second
loaded = {p: summarize(steady(LIGHT, 64, p)) for p in ("static", "continuous")}
print(f"{LIGHT:.0f} `mixed` requests per second, max_num_seqs=64 (H100, simulated)")
for p, m in loaded.items():
    print(f"{p:10s}: TTFT p50 {m['ttft_p50']:6.2f} s, end-to-end p50 {m['e2e_p50']:6.2f} s, "
          f"TPOT p50 {m['tpot_p50'] * 1e3:5.2f} ms, mean real batch {m['mean_batch_size']:5.1f}")

# %%
# NBVAL_CHECK_OUTPUT
s_, c_ = loaded["static"], loaded["continuous"]
assert s_["e2e_p50"] > 3 * c_["e2e_p50"] and abs(s_["tpot_p50"] / c_["tpot_p50"] - 1) < 0.05  # what the text says
assert s_["tpot_p50"] > c_["tpot_p50"] and s_["wall_s"] < 1.1 * c_["wall_s"]  # both keep up: the runs end together
say(f"Under load, continuous batching cuts the median end-to-end latency **{s_['e2e_p50'] / c_['e2e_p50']:.1f}x** "
    f"(TTFT p50 {s_['ttft_p50']:.2f} s → {c_['ttft_p50']:.2f} s): nobody waits for a batch to finish. At equal load "
    f"the TPOT is about the same ({s_['tpot_p50'] * 1e3:.2f} ms static, {c_['tpot_p50'] * 1e3:.2f} ms continuous; "
    f"static's steps also compute padding). What raises TPOT is the batch: at full batches, "
    f"{tpot[sizes[0]] * 1e3:.2f} ms at `max_num_seqs={sizes[0]}`, {tpot[sizes[-1]] * 1e3:.2f} ms at "
    f"`max_num_seqs={sizes[-1]}` (section 1).")

# %% [stored]
fig = make_subplots(rows=1, cols=2, subplot_titles=("per token: TPOT p50 rises with the batch",
                                                    "per request, under load: latency falls"))
fig.add_scatter(x=sizes, y=[tpot[n] * 1e3 for n in sizes], mode="lines+markers", name="continuous, full batches",
                row=1, col=1)
for metric, label in (("ttft_p50", "TTFT p50"), ("e2e_p50", "end-to-end p50")):
    fig.add_bar(x=list(loaded), y=[loaded[p][metric] for p in loaded], name=label, row=1, col=2)
fig.update_xaxes(title_text="max_num_seqs", type="log", row=1, col=1)
fig.update_yaxes(title_text="ms", row=1, col=1)
fig.update_yaxes(title_text="s (log)", type="log", row=1, col=2)
fig.update_layout(height=360, barmode="group", title="(2): both halves of the answer (H100, simulated)")
fig

# %% [markdown]
# The third part is the cost. In-flight batching without chunks admits a new prompt into
# the running decodes' step (lesson 3), so every arrival's prefill delays everybody's next
# token; static batching runs its prompts before its decodes start and never mixes them
# in. The `long-prompt` preset (lesson 6: a few long prompts among short requests) under
# a light steady load, with chunked prefill (lesson 6) for comparison at three budgets:
# the lab's CPU default (`256`), vLLM's advice for inter-token latency (`2048`) and vLLM's
# default for an H100 (`8192`):

# %%
# NBVAL_CHECK_OUTPUT
stream = make_workload("long-prompt", num_requests=300, seed=0, rate=5.0, max_model_len=8192, vocab_size=128256)
BUDGETS = (256, 2048, vllm_default_budget("h100"))
gaps = {p: summarize(simulate(stream, p, max_num_seqs=64, max_model_len=8192)) for p in ("static", "continuous")}
gaps |= {f"chunked {b}": summarize(simulate(stream, "chunked", max_num_seqs=64, max_model_len=8192,
                                            max_num_batched_tokens=b)) for b in BUDGETS}
print(f"{len(stream)} `long-prompt` requests at 5 req/s, max_num_seqs=64 (H100, simulated)")
for p, m in gaps.items():
    print(f"{p:13s}: ITL p50 {m['itl_p50'] * 1e3:5.1f} ms, worst gap p99 {m['itl_worst_p99'] * 1e3:6.1f} ms, "
          f"ITL max {m['itl_max'] * 1e3:6.1f} ms; TTFT p50 {m['ttft_p50'] * 1e3:6.0f} ms")

# %%
# NBVAL_CHECK_OUTPUT
st, co = gaps["static"], gaps["continuous"]
ch, default = gaps[f"chunked {BUDGETS[0]}"], gaps[f"chunked {BUDGETS[-1]}"]
assert co["itl_max"] > 5 * st["itl_max"] and co["itl_worst_p99"] > 5 * st["itl_worst_p99"]  # the verdict below
assert ch["itl_max"] < 2 * st["itl_max"] and default["itl_worst_p99"] >= co["itl_worst_p99"]
assert co["ttft_p50"] < st["ttft_p50"] / 10
say(check("000", "Continuous batching's gain is system throughput, not a single request's latency; filling the "
                 "batch can raise a request's ITL (连续批处理的核心收益是系统吞吐量 … ITL 反而可能上升).",
          f"Half right. Under load, the latency a user sees falls (end to end "
          f"**{s_['e2e_p50'] / c_['e2e_p50']:.1f}x** lower above): nobody waits for a batch to finish. The time per "
          f"token follows the batch a request shares its steps with, whatever the policy. And the ITL *tail* is "
          f"in-flight batching's cost: without chunks, each long prompt stalls every running decode, so the worst "
          f"gap of one request in a hundred is **{co['itl_worst_p99'] * 1e3:.0f} ms** against "
          f"{st['itl_worst_p99'] * 1e3:.0f} ms for static batching (worst of all {co['itl_max'] * 1e3:.0f} ms against "
          f"{st['itl_max'] * 1e3:.0f} ms). Chunked prefill (lesson 6) takes it back to "
          f"{ch['itl_worst_p99'] * 1e3:.0f} ms with a {BUDGETS[0]}-token budget, "
          f"{gaps[f'chunked {BUDGETS[1]}']['itl_worst_p99'] * 1e3:.0f} ms with {BUDGETS[1]:,}; at vLLM's H100 default "
          f"({BUDGETS[-1]:,}) these prompts fit one step whole, and the tail is no better than without chunks "
          f"({default['itl_worst_p99'] * 1e3:.0f} ms): the budget, not chunking alone, sets it. On a CPU, where a prompt costs far more than a decode, lesson 9 "
          f"measures the same from the client's side."))

# %% [markdown]
# The source's corrected statement goes on: under a latency SLO, continuous batching
# maximises throughput; for a throughput target, it minimises the GPUs needed. Section
# 2b measured the first half, DistServe's goodput; lesson 7b turns it into GPUs.

# %% [markdown]
# ### (3) "Dynamic batching helps prefill and decode alike"
#
# The sources say the gains come from **decode**, and the lab agrees — for two different
# reasons, tested separately. First, batching itself: a prefill step is already
# compute-bound past a few hundred tokens (lesson 1), so batching prompts together gains
# little; decode steps are memory-bound, and filling them is nearly free. The same
# requests with equal prompts, once prefill-only (one output token each) and once
# decode-heavy (the `mixed` preset's output lengths), run one at a time and in batches
# (`max_num_seqs=32`), both under continuous batching:

# %%
# NBVAL_CHECK_OUTPUT
prefill_only = [RequestSpec(s.id, [1] * 512, max_tokens=1) for s in offline]
decode_heavy = [RequestSpec(s.id, [1] * 512, max_tokens=s.max_tokens) for s in offline]

def tput(specs, policy, n):
    return summarize(simulate(specs, policy, max_num_seqs=n))["total_tok_per_s"]  # prompt + output tokens / s

batching = {}
for name, specs in (("prefill-only", prefill_only), ("decode-heavy", decode_heavy)):
    batching[name] = tput(specs, "continuous", 32) / tput(specs, "continuous", 1)
    print(f"{name:12s}: batch of up to 32 / one at a time = {batching[name]:5.2f}x")
assert batching["decode-heavy"] > 5 * batching["prefill-only"]  # "the lab agrees"

# %% [markdown]
# Second, the reason the source gives for iteration-level scheduling: lengths differ
# mostly in decode (长度差异主要在 decode 阶段体现). Continuous against static batching, on
# the same prompts, with one output token, with equal output lengths, and with the
# `mixed` preset's varied ones:

# %%
# NBVAL_CHECK_OUTPUT
EQUAL = round(sum(s.max_tokens for s in offline) / len(offline))  # the varied lengths' mean
decode_equal = [RequestSpec(s.id, [1] * 512, max_tokens=EQUAL) for s in offline]
gain = {}
for name, specs in (("prefill-only", prefill_only), (f"decode, all {EQUAL}", decode_equal),
                    ("decode, varied", decode_heavy)):
    gain[name] = tput(specs, "continuous", 32) / tput(specs, "static", 32)
    print(f"{name:15s}: continuous / static throughput = {gain[name]:.2f}x")
same = [g for name, g in gain.items() if name != "decode, varied"]
assert max(abs(g - 1) for g in same) < 0.05 and gain["decode, varied"] > 2  # the sentence below

# %%
# NBVAL_CHECK_OUTPUT
say(check("000", "The gain of dynamic batching is mainly in decode, where lengths differ (长度差异主要在 decode 阶段体现); "
                 "prefill is a one-off computation that needs little dynamic scheduling.",
          f"Right, for two reasons. With nothing to pad and no row finishing early (one output token, or equal "
          f"lengths) static and continuous batching are equal ({min(same):.2f}–{max(same):.2f}x); with the output "
          f"lengths varying, continuous batching is **{gain['decode, varied']:.2f}x** faster: the gain comes from "
          f"length variance. And decode being memory-bound is what makes batching pay at all "
          f"({batching['decode-heavy']:.1f}x against {batching['prefill-only']:.2f}x for prompts)."))

# %% [stored]
fig = make_subplots(rows=1, cols=2, subplot_titles=("batching: up to 32 / one at a time", "continuous / static"))
fig.add_bar(x=list(batching), y=list(batching.values()), text=[f"{g:.2f}x" for g in batching.values()], row=1, col=1)
fig.add_bar(x=list(gain), y=list(gain.values()), text=[f"{g:.2f}x" for g in gain.values()], row=1, col=2)
fig.add_hline(y=1, line_dash="dot")
fig.update_layout(height=340, showlegend=False,
                  title=f"{len(offline)} requests of {len(prefill_only[0].prompt_ids)}-token prompts (H100, simulated)")
fig

# %% [markdown]
# ### (4) "With PagedAttention, in-flight batching is not needed"
#
# They are complementary. In-flight batching decides *who* runs each step; paging
# decides *how much memory* each running request holds, and so how many can run. On a
# tight KV cache, all four combinations:

# %%
# NBVAL_CHECK_OUTPUT
from minilm.sim.costmodel import CostModel

BLOCKS = 512
kv_gib = BLOCKS * 16 * CostModel("llama-3-8b", "h100").kv_bytes_per_token / 2**30
print(f"KV cache: {BLOCKS} blocks of 16 tokens, {kv_gib:.1f} GiB")
combos = {}
for policy in ("static", "continuous"):
    for mode in ("reserved", "paged"):
        tl = simulate(offline, policy, kv_mode=mode, num_blocks=BLOCKS, max_num_seqs=256)
        m = summarize(tl)
        combos[f"{policy}, {mode}"] = m["output_tok_per_s"]
        print(f"{policy:10s} {mode:8s} KV: {m['output_tok_per_s']:6.0f} tok/s, mean batch {m['mean_batch_size']:5.1f}, "
              f"peak running {max(s.num_running for s in tl.steps):3d}")
assert combos["static, paged"] == combos["static, reserved"] and max(combos, key=combos.get) == "continuous, paged"

# %% [stored]
fig = go.Figure(go.Bar(x=list(combos), y=list(combos.values()),
                       marker_color=["#7f7f7f", "#7f7f7f", "#1f77b4", "#2ca02c"]))
fig.update_layout(yaxis_title="output tokens / s", height=320, title="scheduling × memory (H100, tight KV, simulated)")
fig

# %% [markdown]
# The two static rows are not an experiment: they are equal by construction, and the
# assert above checks the construction, not a finding. In this engine, paging gives static
# batching nothing: its static
# policy (lesson 2) reserves every row's KV for the padded length up front, in either KV
# mode, as an engine running fixed-shape batches does, so the blocks a finished row
# frees go to no one. A static engine that allocated blocks on demand could start more
# rows in the same memory — at the risk of running out mid-batch as the rows grow, and
# then having to preempt one. In-flight scheduling alone removes padding and waiting,
# but without paging it has free places in the batch and no memory to fill them with.
# Together they make the biggest batch.
#
# The reserved rows here are reservation at its kindest: the simulator runs every request
# to exactly its `max_tokens`, so reserving `prompt + max_tokens` reserves each request's
# true length, and only the tokens not generated yet sit empty. Lesson 4's reserved run,
# on the same number of blocks, has requests that stop at their own length before
# `max_tokens`, as a real model does at its end-of-text token, so it reserves slots that
# are never filled and runs a smaller batch, at lower throughput.

# %% [markdown]
# **What to remember.** Measure against the promise: goodput under an SLO, and say which
# goodput; and measure under a steady load that lasts many request lifetimes, not a
# burst. Batch more to raise throughput, at the cost of per-token latency; chunk prompts
# (lesson 6) to keep that latency even; page the KV cache to afford the batch. Lesson 7b:
# how many GPUs, which GPU, what a token costs, and what came after in-flight batching.
#
# **Exercise 7** (`exercises/07_tradeoffs_slos.ipynb`): request goodput, and goodput
# under per-percentile SLOs.
