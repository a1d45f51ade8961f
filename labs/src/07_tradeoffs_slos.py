# %% [markdown]
# # 7 · Trade-offs and SLOs
#
# A serving engine is tuned against a promise to its users, a **service-level
# objective (SLO)**: a limit on the time to first token (TTFT) and on the time per output
# token after it (TPOT). Throughput that breaks the promise is worth little, hence
# **goodput**: what a deployment serves *within* the SLO. This lesson sweeps the batch
# size, measures goodput in both of the senses the name is used in, tests the sources'
# four misconceptions about in-flight batching with an experiment and a figure each, and
# asks the sources' hardware question: does a faster GPU gain more?
#
# Everything here is **simulated** (Llama-3-8B in bfloat16, cost model of
# `minilm/costmodel.py`): the same scheduler as the real engine, step times predicted,
# identical on every machine.

# %%
# NBVAL_CHECK_OUTPUT
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm import RequestSpec, make_workload, summarize
from minilm.simulator import simulated_engine
from labs.prose import say
import widgets

def simulate(specs, policy="continuous", device="h100", **knobs):
    engine = simulated_engine("llama-3-8b", device, policy=policy, **knobs)
    engine.add_workload(specs)
    return engine.run()

TTFT_SLO, TPOT_SLO = 0.5, 0.010  # seconds: the promise used in this lesson
say(f"The SLO in this lesson: TTFT ≤ **{TTFT_SLO} s** and TPOT ≤ **{TPOT_SLO * 1e3:.0f} ms** (on average, a "
    f"token every {TPOT_SLO * 1e3:.0f} ms or faster once the first has come).")

# %% [markdown]
# ## 1. Throughput against latency
#
# The knob is `max_num_seqs`, the most requests in flight, on an H100 under a steady
# load:

# %%
# NBVAL_CHECK_OUTPUT
RATE, N = 300.0, 600  # requests per second, requests
busy = make_workload("mixed", num_requests=N, seed=0, rate=RATE, vocab_size=128256)
sizes = [8, 32, 64, 128, 256]
runs = {n: simulate(busy, max_num_seqs=n) for n in sizes}  # kept: section 2 judges the same runs
table = pd.DataFrame([{**summarize(tl), "knob": "max_num_seqs", "value": n} for n, tl in runs.items()])
cols = ["value", "output_tok_per_s", "mean_batch_size", "ttft_p50", "ttft_p99", "tpot_p50"]
view = table[cols].rename(columns={"value": "max_num_seqs"})
view[["ttft_p50", "ttft_p99", "tpot_p50"]] *= 1e3  # ms
print(f"{N} `mixed` requests arriving at {RATE:.0f} per second (simulated, times in ms)")
print(view.round(1).to_string(index=False))

# %%
widgets.sweep_figure(table, latency="tpot_p50")

# %% [markdown]
# More requests in flight means more tokens per step, so throughput rises — and each
# step is longer, so every request's tokens come more slowly (TPOT up). With too few in
# flight, requests queue and TTFT explodes.

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
# Same runs as section 1, judged against the SLO (`minilm.metrics.request_goodput`):

# %%
# NBVAL_CHECK_OUTPUT
from minilm.metrics import distserve_goodput, request_goodput, slo_attainment

rows = []
for n, tl in runs.items():
    m = summarize(tl)
    rows.append((n, m["output_tok_per_s"], slo_attainment(tl, TTFT_SLO, TPOT_SLO),
                 request_goodput(tl, TTFT_SLO, TPOT_SLO), m["wall_s"]))
    print(f"max_num_seqs {n:3d}: {m['output_tok_per_s']:6.0f} tok/s, {rows[-1][2]:4.0%} of requests within the SLO, "
          f"request goodput {rows[-1][3]:5.1f} req/s over a {m['wall_s']:.1f} s run")
best = max(rows, key=lambda r: r[3])
fastest = max(rows, key=lambda r: r[1])
assert best[3] < RATE / 2  # the sentence below
say(f"Best request goodput at `max_num_seqs={best[0]}`; highest throughput at `max_num_seqs={fastest[0]}`. "
    f"Note what request goodput is: even at {best[2]:.0%} attainment it is **{best[3]:.0f} req/s**, far below the "
    f"**{RATE:.0f} req/s** that arrived, because the run's span includes the queue draining after the last "
    f"arrival ({N / RATE:.0f} s of arrivals, a {best[4]:.1f} s run). It judges one run at one load.")

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput (output tok/s)", "request goodput (req/s)"))
fig.add_bar(x=[str(r[0]) for r in rows], y=[r[1] for r in rows], name="throughput", row=1, col=1)
fig.add_bar(x=[str(r[0]) for r in rows], y=[r[3] for r in rows], name="request goodput", row=1, col=2)
fig.update_xaxes(title_text="max_num_seqs")
fig.update_layout(height=330, showlegend=False, title="the same runs, two yardsticks (H100, simulated)")
fig

# %% [markdown]
# The setting with the most throughput is not the one that keeps the most promises.
#
# ### 2b. DistServe's goodput: how much load a setting can take
#
# DistServe's question is about capacity: run the same deployment at rising request
# rates and find the highest at which the SLO attainment still reaches the target
# (`minilm.metrics.distserve_goodput`). The request lengths are the same at every rate;
# only the arrivals come faster:

# %%
# NBVAL_CHECK_OUTPUT
TARGET = 0.9
rates = [50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0]
settings = [32, 64, 128, 256]
attainment, capacity = {}, {}
for n in settings:
    by_rate = {r: simulate(make_workload("mixed", num_requests=300, seed=0, rate=r, vocab_size=128256), max_num_seqs=n)
               for r in rates}
    attainment[n] = [slo_attainment(by_rate[r], TTFT_SLO, TPOT_SLO) for r in rates]
    capacity[n] = distserve_goodput(by_rate, TTFT_SLO, TPOT_SLO, TARGET)
    print(f"max_num_seqs {n:3d}: attainment " + " ".join(f"{a:4.0%}" for a in attainment[n])
          + f"  -> DistServe goodput {capacity[n]:.0f} req/s")
print("rates tried (req/s):", [int(r) for r in rates])
top = max(capacity, key=capacity.get)
assert capacity[settings[0]] < capacity[top] > capacity[settings[-1]]  # the sentence below: the best is in between
say(f"With {TARGET:.0%} of requests within the SLO as the target, `max_num_seqs={top}` takes the most load: "
    f"**{capacity[top]:.0f} req/s** (only as fine as the rates tried). Too few in flight and requests queue (TTFT); "
    f"too many and every token is slower (TPOT).")

# %%
fig = go.Figure()
for n in settings:
    fig.add_scatter(x=rates, y=attainment[n], name=f"max_num_seqs={n}", mode="lines+markers")
fig.add_hline(y=TARGET, line_dash="dot", annotation_text=f"target {TARGET:.0%}")
fig.update_layout(xaxis_title="request rate (req/s)", yaxis_title="share of requests within the SLO",
                  yaxis_tickformat=".0%", height=380, title="SLO attainment against load (H100, simulated)")
fig

# %% [markdown]
# Read DistServe's goodput off the figure: the rightmost point of each line above the
# dotted target. Tighten or loosen the SLO in the first cell and watch both goodputs
# move. Exercise 7 asks you to compute both.

# %% [markdown]
# ## 3. The sources' four misconceptions, four experiments
#
# ### (1) "In-flight batching is traditional micro-batching"
#
# Micro-batching (pipeline parallelism, as in GPipe or PipeDream) cuts work into smaller batches
# to keep pipeline stages busy; each micro-batch is still formed once and runs to its
# end. In-flight batching is about *when* the batch changes — at every iteration — not
# about its size. Smaller or bigger static batches do not recover what iteration-level
# scheduling gains:

# %%
# NBVAL_CHECK_OUTPUT
offline = make_workload("mixed", num_requests=200, seed=0, vocab_size=128256)
micro = {}
for policy, n in [("static", 8), ("static", 32), ("static", 128), ("continuous", 32)]:
    m = summarize(simulate(offline, policy, max_num_seqs=n))
    micro[f"{policy} {n}"] = m["output_tok_per_s"]
    print(f"{policy:10s} max_num_seqs {n:3d}: {m['output_tok_per_s']:6.0f} tok/s, "
          f"padding {m['padding_fraction']:4.0%}, mean real batch {m['mean_batch_size']:5.1f}")

# %%
fig = go.Figure(go.Bar(x=list(micro), y=list(micro.values()), marker_color=["#7f7f7f"] * 3 + ["#1f77b4"]))
fig.update_layout(xaxis_title="policy, max_num_seqs", yaxis_title="output tokens / s", height=320,
                  title=f"{len(offline)} requests, all queued (H100, simulated)")
fig

# %% [markdown]
# ### (2) "Continuous batching lowers a single request's latency"
#
# The sources' correction: its gain is throughput, not the latency of one request, and
# filling the batch can *raise* inter-token latency. Half right. Said precisely: the
# *time per output token* rises with the batch a request shares its steps with; the
# latency a user sees *under load* — queueing, TTFT, end to end — falls, because nobody
# waits for a whole batch to finish. Alone on the GPU, a request takes about the same
# time under every policy:

# %%
# NBVAL_CHECK_OUTPUT
alone = [RequestSpec("solo", [1] * 512, max_tokens=256)]
solo = {policy: simulate(alone, policy) for policy in ("static", "continuous", "chunked")}
for policy, tl in solo.items():
    r = tl.requests[0]
    print(f"{policy:10s}: alone, end-to-end {(r.t_finished - r.arrival) * 1e3:7.1f} ms")
chunks = [i.num_tokens for s in solo["chunked"].steps for i in s.items if i.kind == "prefill"]
say(f"Chunking adds a hair alone: its {len(alone[0].prompt_ids)}-token prompt runs as {len(chunks)} chunk(s) of "
    f"{chunks} tokens under the default budget.")

# %% [markdown]
# Under the load of section 1 (`max_num_seqs=64` for both), the two halves of the answer:

# %%
# NBVAL_CHECK_OUTPUT
loaded = {p: summarize(simulate(busy, p, max_num_seqs=64)) for p in ("static", "continuous")}
for p, m in loaded.items():
    print(f"{p:10s}: TTFT p50 {m['ttft_p50']:6.2f} s, end-to-end p50 {m['e2e_p50']:6.2f} s, "
          f"TPOT p50 {m['tpot_p50'] * 1e3:5.2f} ms, mean real batch {m['mean_batch_size']:5.1f}")
s_, c_ = loaded["static"], loaded["continuous"]
tp = dict(zip(table.value, table.tpot_p50))
assert s_["e2e_p50"] > c_["e2e_p50"] and s_["tpot_p50"] < c_["tpot_p50"]  # what the text says
assert all(tp[a] < tp[b] for a, b in zip(sizes, sizes[1:]))
say(f"Under load, continuous batching cuts the median end-to-end latency **{s_['e2e_p50'] / c_['e2e_p50']:.0f}x** "
    f"(TTFT p50 {s_['ttft_p50']:.1f} s → {c_['ttft_p50']:.2f} s), while its TPOT is a little *higher* "
    f"({s_['tpot_p50'] * 1e3:.2f} → {c_['tpot_p50'] * 1e3:.2f} ms): its batches are fuller. And TPOT keeps rising "
    f"with the batch: {tp[sizes[0]] * 1e3:.2f} ms at `max_num_seqs={sizes[0]}`, {tp[sizes[-1]] * 1e3:.2f} ms at "
    f"`max_num_seqs={sizes[-1]}` (section 1).")

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("per token: TPOT p50 rises with the batch",
                                                    "per request, under load: latency falls"))
fig.add_scatter(x=sizes, y=[tp[n] * 1e3 for n in sizes], mode="lines+markers", name="continuous", row=1, col=1)
for metric, label in (("ttft_p50", "TTFT p50"), ("e2e_p50", "end-to-end p50")):
    fig.add_bar(x=list(loaded), y=[loaded[p][metric] for p in loaded], name=label, row=1, col=2)
fig.update_xaxes(title_text="max_num_seqs", type="log", row=1, col=1)
fig.update_yaxes(title_text="ms", row=1, col=1)
fig.update_yaxes(title_text="s (log)", type="log", row=1, col=2)
fig.update_layout(height=360, barmode="group", title="(2): both halves of the answer (H100, simulated)")
fig

# %% [markdown]
# ### (3) "Dynamic batching helps prefill and decode alike"
#
# The sources say the gains come from **decode**, and the lab agrees. A prefill step is
# already compute-bound past a few hundred tokens (lesson 1), so batching prompts
# together gains little; decode steps are memory-bound, and filling them is nearly free.
# The same requests with equal prompts (so padding plays no part), once prefill-only (one
# output token each) and once decode-heavy (the `mixed` preset's output lengths):

# %%
# NBVAL_CHECK_OUTPUT
prefill_only = [RequestSpec(s.id, [1] * 512, max_tokens=1) for s in offline]
decode_heavy = [RequestSpec(s.id, [1] * 512, max_tokens=s.max_tokens) for s in offline]
gain = {}
for name, specs in (("prefill-only", prefill_only), ("decode-heavy", decode_heavy)):
    tput = {p: summarize(simulate(specs, p, max_num_seqs=32))["total_tok_per_s"] for p in ("static", "continuous")}
    gain[name] = tput["continuous"] / tput["static"]
    print(f"{name:12s}: continuous / static throughput (prompt + output tokens/s) = {gain[name]:.2f}")
assert gain["decode-heavy"] > 2 * gain["prefill-only"]  # "the lab agrees"

# %%
fig = go.Figure(go.Bar(x=list(gain), y=list(gain.values()), text=[f"{g:.2f}x" for g in gain.values()]))
fig.add_hline(y=1, line_dash="dot")
fig.update_layout(yaxis_title="continuous / static throughput", height=320,
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
from minilm.costmodel import CostModel

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

# %%
fig = go.Figure(go.Bar(x=list(combos), y=list(combos.values()),
                       marker_color=["#7f7f7f", "#7f7f7f", "#1f77b4", "#2ca02c"]))
fig.update_layout(yaxis_title="output tokens / s", height=320, title="scheduling × memory (H100, tight KV, simulated)")
fig

# %% [markdown]
# Paging alone gives static batching nothing: a static batch holds its memory until its
# longest row ends, so blocks a finished row frees cannot be given to anyone. In-flight
# scheduling alone removes padding and waiting, but without paging it has free places in
# the batch and no memory to fill them with. Together they make the biggest batch.

# %% [markdown]
# ## 4. The hardware question: does a faster GPU gain more?
#
# > Source 000: the value of high-end GPUs such as the H100/H200 is amplified: the more
# > compute, the more static batching wastes, and the more dynamic scheduling gains.
#
# The same workload and policies on four GPUs (simulated; each GPU's KV cache is the
# memory left after the weights). Cost per million output tokens needs a price per
# GPU-hour; the table below is an **assumption** (round on-demand cloud prices), not data
# — change it to your provider's:

# %%
# NBVAL_CHECK_OUTPUT
fleet = make_workload("mixed", num_requests=300, seed=1, vocab_size=128256)  # all queued: each GPU at capacity
USD_PER_GPU_HOUR = {"h100": 3.00, "h200": 3.80, "a100": 1.80, "l4": 0.80}  # ASSUMED prices, edit them
hw = []
for device, price in USD_PER_GPU_HOUR.items():
    for policy in ("static", "continuous", "chunked"):
        m = summarize(simulate(fleet, policy, device=device, max_num_seqs=128))
        hw.append({"gpu": device, "policy": policy, "tok/s per GPU": m["output_tok_per_s"],
                   "$ / M output tokens": price / 3600 / m["output_tok_per_s"] * 1e6,
                   "mean batch": m["mean_batch_size"]})
hw = pd.DataFrame(hw)
print(f"{len(fleet)} `mixed` requests, all queued, max_num_seqs=128 (simulated; prices assumed, $/GPU-hour: "
      f"{USD_PER_GPU_HOUR})")
print(hw.round(3).to_string(index=False))

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("output tokens / s per GPU", "$ per million output tokens (assumed prices)"))
for i, policy in enumerate(("static", "continuous", "chunked")):
    part = hw[hw.policy == policy]
    color = widgets.latency.policy_color(policy, i)
    fig.add_bar(x=part.gpu, y=part["tok/s per GPU"], name=policy, marker_color=color, row=1, col=1)
    fig.add_bar(x=part.gpu, y=part["$ / M output tokens"], name=policy, marker_color=color, showlegend=False,
                row=1, col=2)
fig.update_layout(barmode="group", height=360, title="Llama-3-8B on four GPUs (simulated)")
fig

# %%
# NBVAL_CHECK_OUTPUT
wide = hw.pivot(index="gpu", columns="policy", values="tok/s per GPU").loc[list(USD_PER_GPU_HOUR)]
ratio = wide.continuous / wide.static
gained = wide.continuous - wide.static
static_batch = hw[hw.policy == "static"].set_index("gpu")["mean batch"]
cost = hw.pivot(index="gpu", columns="policy", values="$ / M output tokens")
assert gained.idxmax() in ("h100", "h200") and ratio.idxmax() == static_batch.idxmin() == "l4"  # the text below
assert ratio["a100"] > max(ratio["h100"], ratio["h200"]) and static_batch["a100"] == static_batch["h100"]
assert (cost.static > cost[["continuous", "chunked"]].max(axis=1)).all()
say("**The source, checked.** In absolute terms the claim holds: continuous batching adds "
    + ", ".join(f"{g.upper()} {gained[g]:,.0f}" for g in gained.index)
    + " output tokens/s per GPU. As a ratio it does not: continuous / static is "
    + ", ".join(f"{g.upper()} {ratio[g]:.1f}x" for g in ratio.index)
    + f". The largest ratio is on the **{ratio.idxmax().upper()}**, the smallest GPU: its little memory leaves "
    f"static batching, which reserves KV for every padded row, the smallest batches ({static_batch.min():.1f} "
    f"requests on average, {static_batch.max():.1f} on the others). Even the A100, with the H100's memory and so "
    f"the same batches, gains more as a ratio: static batching's padding costs compute, and compute is what the "
    f"A100 has least of next to its bandwidth. In-flight batching gives the cheaper tokens "
    f"on every GPU; which GPU is cheapest per token depends on the prices you assume.")

# %% [markdown]
# The sources also suggest deploying vLLM and comparing continuous batching on and off.
# vLLM has no switch for that: its scheduler is built on iteration-level scheduling, and
# we found no flag to turn it off in its engine arguments. The comparison is lesson 3's,
# on this engine; lesson 9 serves this engine over an OpenAI-compatible HTTP API and
# measures it with a benchmark client that speaks to vLLM too.
#
# **What to remember.** Measure against the promise: goodput under an SLO, and say which
# goodput. Batch more to raise throughput, at the cost of per-token latency; chunk
# prompts (lesson 6) to keep that latency even; page the KV cache to afford the batch.
#
# **Exercise 7** (`exercises/07_tradeoffs_slos.ipynb`): compute both goodputs yourself.
