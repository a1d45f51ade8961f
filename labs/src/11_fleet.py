# %% [markdown]
# # 11 · From one GPU to a fleet
#
# Lessons 2–10 asked how one engine should batch. A service meets the next question as
# soon as one GPU is not enough: how many replicas, behind which router, with prefill and
# decode together or apart, on which GPUs, for a given load and latency promise. This
# lesson answers each part on the simulator (Llama-3-8B on H100s, `minilm/sim/`), where
# every replica is a whole engine (its own scheduler, KV cache and clock) and a global
# router (`minilm/router.py`) picks a replica for each request as it arrives, seeing only
# what a real router could: each replica's outstanding requests and KV blocks at that
# moment, and how much of the prompt its prefix cache holds. Every time below is
# **simulated** by the roofline cost model, not measured, and every run is seeded, so
# the numbers are the same on every machine.
#
# Vidur (Agrawal et al., MLSys 2024) answers these questions as a research tool; the
# pieces here follow it (round-robin and least-outstanding routing, capacity by
# bisection), DistServe and Splitwise (disaggregation), and SGLang's router and llm-d
# (routing by cached prefix). docs/FLEET.md has the reference.

# %%
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labs.prose import say
from minilm.router import PrefixAware
from minilm.sim.cluster import fleet_summary, replica_summaries, simulated_cluster
from minilm.workload import RequestSpec, skewed_workload, system_prompt_workload
import widgets

VOCAB = 128256  # Llama-3's: prompts are random token ids, which a simulated model does not read

# %% [markdown]
# ## 1. Replicas and routing
#
# The simplest router sends each request to the next replica in turn: **round-robin**.
# It is fair in requests, and requests are not equal. Here every fourth request is a long
# one (a batch job that asks for hundreds of output tokens, among chat users who ask for a
# few dozen), four replicas serve them, and each replica has `max_num_seqs=4` seats: a
# replica short of memory, so a queue forms at a modest rate. Round-robin sends every
# long request to the same replica. **Least outstanding** (Vidur's LOR) sends each
# request to the replica with the fewest requests routed to it and not finished.

# %%
# NBVAL_CHECK_OUTPUT
TTFT_SLO, TPOT_SLO = 0.5, 0.05  # seconds: this section's promise


def serve(specs, router, replicas=4, model="llama-3-8b", **knobs):
    knobs = {"policy": "chunked", "record_kv_blocks": False, **knobs}
    cluster = simulated_cluster(model, "h100", replicas=replicas, router=router, **knobs)
    cluster.add_workload(specs)
    return cluster.run()


SKEWED = skewed_workload(200, rate=8.0)
skew_runs = {r: serve(SKEWED, r, max_num_seqs=4) for r in ("round_robin", "least_outstanding")}
rows = []
for router, run in skew_runs.items():
    for name, m in replica_summaries(run, TTFT_SLO, TPOT_SLO).items():
        tl = next(t for t in run.timelines if t.meta["replica"] == name)
        rows.append({"router": router, "replica": name, "requests": m["requests"],
                     "output tokens": m["output_tokens"], "longest queue": max(s.num_waiting for s in tl.steps),
                     "TTFT p99 (s)": m["ttft_p99"]})
per_replica = pd.DataFrame(rows)
print(f"{len(SKEWED)} requests at 8 req/s, 4 replicas of 4 seats (simulated H100s)")
print(per_replica.round(3).to_string(index=False))

# %% [stored]
fig = make_subplots(rows=1, cols=2, subplot_titles=["output tokens a replica", "longest queue (requests)"])
for router, group in per_replica.groupby("router", sort=False):
    fig.add_bar(x=group["replica"], y=group["output tokens"], name=router, row=1, col=1,
                marker_color="#e76f51" if router == "round_robin" else "#2a9d8f")
    fig.add_bar(x=group["replica"], y=group["longest queue"], name=router, row=1, col=2, showlegend=False,
                marker_color="#e76f51" if router == "round_robin" else "#2a9d8f")
fig.update_layout(height=340, title="Every fourth request is long: where the work went (simulated)")
fig

# %%
# NBVAL_CHECK_OUTPUT
fleet = {r: fleet_summary(run, TTFT_SLO, TPOT_SLO) for r, run in skew_runs.items()}
rr, lor = fleet["round_robin"], fleet["least_outstanding"]
work = per_replica.groupby("router", sort=False)["output tokens"]
share = (work.max() / work.sum())["round_robin"]
assert rr["slo_attainment"] < lor["slo_attainment"] and rr["ttft_p99"] > 10 * lor["ttft_p99"]
say(f"Round-robin gave one replica **{share:.0%}** of the output tokens: every long request. Its queue "
    f"made the fleet's TTFT p99 **{rr['ttft_p99']:.1f} s**, and only {rr['slo_attainment']:.0%} of requests "
    f"met TTFT {TTFT_SLO} s and TPOT {TPOT_SLO * 1e3:.0f} ms, while three replicas sat nearly idle. Least "
    f"outstanding, on the same GPUs and requests, kept the TTFT p99 at **{lor['ttft_p99'] * 1e3:.0f} ms** "
    f"and {lor['slo_attainment']:.0%} within the limits.")

# %% [markdown]
# That pattern is round-robin's worst case: the lengths line up with its turn. Shuffle the
# same requests so that a long one can come at any position, and round-robin's
# imbalance is left to chance. The router's log (`widgets.routes_frame`) keeps each
# decision and the loads it saw; the first lines of least-outstanding's:

# %%
# NBVAL_CHECK_OUTPUT
rng = np.random.default_rng(1)
order = rng.permutation(len(SKEWED))
shuffled = [RequestSpec(s.id, SKEWED[j].prompt_ids, SKEWED[j].max_tokens, s.arrival) for s, j in zip(SKEWED, order)]
shuffled_runs = {r: serve(shuffled, r, max_num_seqs=4) for r in ("round_robin", "least_outstanding")}
shuffled_fleet = {r: fleet_summary(run, TTFT_SLO, TPOT_SLO) for r, run in shuffled_runs.items()}
for r, m in shuffled_fleet.items():
    print(f"shuffled, {r:17s}: TTFT p99 {m['ttft_p99']:6.3f} s, {m['slo_attainment']:.1%} within the SLOs")
print(widgets.routes_frame(shuffled_runs["least_outstanding"]).head(6).to_string(index=False))

# %%
# NBVAL_CHECK_OUTPUT
s_rr, s_lor = shuffled_fleet["round_robin"], shuffled_fleet["least_outstanding"]
sentence = (f"Shuffled, round-robin's TTFT p99 is {s_rr['ttft_p99']:.2f} s against least outstanding's "
            f"{s_lor['ttft_p99']:.2f} s: ")
if s_rr["ttft_p99"] > s_lor["ttft_p99"]:
    sentence += (f"**{s_rr['ttft_p99'] / s_lor['ttft_p99']:.1f}x** worse. Without the worst case, chance still "
                 "puts two long requests on one replica now and then; a router that looks at the load does not.")
else:
    sentence += "on these requests chance spread the long ones well enough; the worst case above is what it risks."
say(sentence)

# %% [markdown]
# ## 2. Cache-aware routing: hit rate against balance
#
# With prefix caching (lesson 8), a replica that served a system prompt keeps its KV and
# can serve the next request with that prompt without computing it again, but only that
# replica: the caches are not shared. A load-only router spreads every system prompt over
# every replica, so each cache must hold all of them. Here sixteen system prompts of
# one to two thousand tokens are equally popular, and each replica's KV cache has
# `num_blocks=600` (blocks of `16` tokens: about six system prompts and the running
# requests). **Prefix-aware** routing (SGLang's router, llm-d's prefix scorer) sends a
# request to the replica that caches the longest prefix of its prompt.

# %%
# NBVAL_CHECK_OUTPUT
CACHE = {"enable_prefix_caching": True, "num_blocks": 600, "max_num_seqs": 16}


EVEN = system_prompt_workload(16, rate=20.0, n=300)
cache_runs = {r: serve(EVEN, r, **CACHE) for r in ("round_robin", "least_outstanding", "prefix_aware")}
cache_fleet = {r: fleet_summary(run, 0.5, 0.05) for r, run in cache_runs.items()}
for r, m in cache_fleet.items():
    print(f"{r:17s}: hit rate {m['prefix_cache_hit_rate']:5.1%}, TTFT p50 {m['ttft_p50'] * 1e3:5.1f} ms, "
          f"p99 {m['ttft_p99'] * 1e3:5.1f} ms, requests a replica {[m2['requests'] for m2 in replica_summaries(cache_runs[r]).values()]}")

# %%
# NBVAL_CHECK_OUTPUT
lo, pa = cache_fleet["least_outstanding"], cache_fleet["prefix_aware"]
assert pa["prefix_cache_hit_rate"] > lo["prefix_cache_hit_rate"] and pa["ttft_p50"] < lo["ttft_p50"]
say(f"Least outstanding found **{lo['prefix_cache_hit_rate']:.0%}** of the prompt tokens in a cache; prefix-aware "
    f"routing, on the same GPUs and caches, **{pa['prefix_cache_hit_rate']:.0%}**, and the median TTFT fell from "
    f"{lo['ttft_p50'] * 1e3:.0f} ms to {pa['ttft_p50'] * 1e3:.0f} ms: each replica keeps a few prompts warm "
    f"instead of all of them lukewarm.")

# %% [markdown]
# Routing by cache alone has its own failure: when one system prompt is popular, every
# request with it goes to one replica, which then queues while the others idle. So
# `PrefixAware(balance)` takes the cached replica only if it has at most `balance`
# outstanding requests more than the least loaded one; otherwise the least loaded gets
# the request (and, from then on, caches that prompt too). Below, the first prompt is
# three quarters of the traffic (`hot=48` extra copies among sixteen), at a rate one
# replica cannot serve alone, and the bound is swept; `balance=None` stands for no bound.

# %%
# NBVAL_CHECK_OUTPUT
HOT = system_prompt_workload(16, rate=100.0, n=300, hot=48)
BALANCES = (0, 1, 2, 4, 8, 32, None)
rows = []
for b in BALANCES:
    run = serve(HOT, PrefixAware(10**9 if b is None else b), **CACHE)
    m = fleet_summary(run, 0.5, 0.05)
    per = [m2["requests"] for m2 in replica_summaries(run).values()]
    rows.append({"balance": "none" if b is None else b, "hit rate": m["prefix_cache_hit_rate"],
                 "TTFT p50 (ms)": 1e3 * m["ttft_p50"], "TTFT p99 (ms)": 1e3 * m["ttft_p99"],
                 "busiest share": max(per) / sum(per), "within SLOs": m["slo_attainment"]})
for r in ("least_outstanding",):
    m = fleet_summary(serve(HOT, r, **CACHE), 0.5, 0.05)
    rows.append({"balance": r, "hit rate": m["prefix_cache_hit_rate"], "TTFT p50 (ms)": 1e3 * m["ttft_p50"],
                 "TTFT p99 (ms)": 1e3 * m["ttft_p99"], "busiest share": np.nan,
                 "within SLOs": m["slo_attainment"]})
sweep = pd.DataFrame(rows)
print("one hot prompt (3/4 of requests), 300 requests at 100 req/s, 4 replicas; SLOs 500 ms / 50 ms; simulated")
print(sweep.round(3).to_string(index=False))

# %% [stored]
bounded = sweep[sweep["balance"] != "least_outstanding"]
labels = [str(b) for b in bounded["balance"]]
fig = make_subplots(specs=[[{"secondary_y": True}]])
fig.add_scatter(x=labels, y=bounded["hit rate"], name="hit rate", mode="lines+markers")
fig.add_scatter(x=labels, y=bounded["TTFT p99 (ms)"], name="TTFT p99 (ms)", mode="lines+markers", secondary_y=True)
fig.update_yaxes(title_text="hit rate", secondary_y=False)
fig.update_yaxes(title_text="TTFT p99 (ms)", type="log", secondary_y=True)
fig.update_xaxes(title_text="balance (outstanding requests a cached replica may have above the least loaded)")
fig.update_layout(height=360, title="One hot prompt: the load bound trades hit rate for a queue (simulated)")
fig

# %%
# NBVAL_CHECK_OUTPUT
none = sweep[sweep["balance"] == "none"].iloc[0]
KEEP = 0.99  # the share within the SLOs a bound must keep
ok = sweep[(sweep["balance"] != "none") & (sweep["balance"] != "least_outstanding") & (sweep["within SLOs"] >= KEEP)]
best = ok.loc[ok["hit rate"].idxmax()]
lo_hot = sweep[sweep["balance"] == "least_outstanding"].iloc[0]
assert none["within SLOs"] < best["within SLOs"] and best["hit rate"] > lo_hot["hit rate"]
say(f"Without a bound, prefix-aware routing hits the most (**{none['hit rate']:.0%}**) and sends "
    f"{none['busiest share']:.0%} of the requests to one replica: TTFT p99 "
    f"**{none['TTFT p99 (ms)'] / 1e3:.1f} s**, {none['within SLOs']:.0%} within the limits. With "
    f"`balance={best['balance']}`, the highest hit rate that kept at least {KEEP:.0%} within them, it hits "
    f"{best['hit rate']:.0%} with a TTFT p99 of {best['TTFT p99 (ms)']:.0f} ms; least outstanding, blind to "
    f"the cache, hits {lo_hot['hit rate']:.0%}. The bound decides how much imbalance a cache hit is worth.")

# %% [markdown]
# ## 3. Disaggregation against colocation
#
# A colocated replica runs prefills and decodes in the same steps, so a long prompt slows
# the decodes that share its step (lesson 6). **Disaggregation** (DistServe, Splitwise)
# gives prefill and decode their own GPUs: a prefill replica computes the prompt and the
# first token, then sends the prompt's KV cache over a link to a decode replica, which
# generates the rest. The price: fewer GPUs on each side, and the transfer. In the Gantt
# below (one prefill and one decode H100, Llama-2-7B, whose KV is four times Llama-3-8B's
# a token, over a `100` Gb/s Ethernet link) each transfer is drawn on the decode replica's
# row, from when the link was free to when the KV arrived; a wait for the link before it
# shows as queued.

# %% [stored]
from minilm.sim.disaggregation import simulated_disaggregated
from minilm.workload import make_workload


def disaggregated(model, specs, prefill=1, decode=1, link="nvlink", **knobs):
    fleet = simulated_disaggregated(model, "h100", prefill=prefill, decode=decode, link=link,
                                    record_kv_blocks=False, **knobs)
    fleet.add_workload(specs)
    return fleet.run()


small = make_workload("long-prompt", 16, seed=0, rate=40.0, vocab_size=32000, max_model_len=4096)
gantt_run = disaggregated("llama-2-7b", small, link="ethernet", max_model_len=4096)
widgets.fleet_figure(gantt_run)

# %%
# NBVAL_CHECK_OUTPUT
x = gantt_run.transfers
longest = max(x, key=lambda t: t.t_end - t.t_start)
say(f"Each of the {len(x)} prompts crossed the link once, after its last chunk ran; the longest, "
    f"{longest.num_tokens} tokens ({longest.num_bytes / 1e6:.0f} MB of KV), took "
    f"**{(longest.t_end - longest.t_start) * 1e3:.1f} ms** on the Ethernet link.")

# %% [markdown]
# Who wins depends on the workload, the SLOs and the GPUs to split. Three cases, each at
# one fixed rate, on the same number of H100s, with `max_num_seqs=128`; the measure is
# the share of requests within both limits (DistServe's SLO attainment):
#
# * long prompts among short chats, four GPUs, a tight promise (TTFT `200` ms, TPOT
#   `12` ms): decodes that share a step with a long prompt miss the TPOT limit;
# * `mixed` traffic on only two GPUs, a looser promise (`500` ms / `20` ms): one decode GPU
#   must carry all the decoding;
# * the same long prompts with Llama-2-7B on two GPUs, over NVLink and over Ethernet.

# %%
# NBVAL_CHECK_OUTPUT
CASES = [  # (case, model, workload, GPUs, rate, TTFT limit, TPOT limit, P:D splits with their link)
    ("long prompts, tight SLO", "llama-3-8b", "long-prompt", 4, 250.0, 0.2, 0.012, [(1, 3, "nvlink")]),
    ("mixed, two GPUs", "llama-3-8b", "mixed", 2, 250.0, 0.5, 0.02, [(1, 1, "nvlink")]),
    ("4x the KV, slow link", "llama-2-7b", "long-prompt", 2, 60.0, 0.5, 0.02, [(1, 1, "nvlink"), (1, 1, "ethernet")]),
]
KNOBS = {"max_num_seqs": 128, "max_model_len": 4096}
N_SPLIT = 400
rows = []
for case, model, workload, gpus, rate, ttft, tpot, splits in CASES:
    specs = make_workload(workload, N_SPLIT, seed=0, rate=rate, vocab_size=32000, max_model_len=4096)
    runs = {f"{gpus} x {p}": serve(specs, "least_outstanding", gpus, model, policy=p, **KNOBS)
            for p in ("continuous", "chunked")}
    runs |= {f"{p}P{d}D {link}": disaggregated(model, specs, p, d, link, **KNOBS) for p, d, link in splits}
    for name, run in runs.items():
        m = fleet_summary(run, ttft, tpot)
        xs = run.transfers
        rows.append({"case": case, "deployment": name, "within SLOs": m["slo_attainment"],
                     "TTFT p99 (ms)": 1e3 * m["ttft_p99"], "TPOT p99 (ms)": 1e3 * m["tpot_p99"],
                     "transfer mean (ms)": 1e3 * np.mean([t.t_end - t.t_start for t in xs]) if xs else np.nan,
                     "link wait max (ms)": 1e3 * max(t.t_start - t.t_ready for t in xs) if xs else np.nan})
split_table = pd.DataFrame(rows)
print(f"{N_SPLIT} requests a run, simulated H100s")
print(split_table.round(3).to_string(index=False))

# %% [stored]
fig = go.Figure()
for case, group in split_table.groupby("case", sort=False):
    fig.add_bar(x=group["deployment"], y=group["within SLOs"], name=case)
fig.add_hline(y=0.9, line_dash="dot", annotation_text="DistServe's 90%")
fig.update_layout(height=360, barmode="group", yaxis_title="share within both SLO limits",
                  title="Colocated or disaggregated, on the same GPUs (simulated)")
fig

# %%
# NBVAL_CHECK_OUTPUT
t = split_table.set_index(["case", "deployment"])["within SLOs"]
lp, mx = t["long prompts, tight SLO"], t["mixed, two GPUs"]
tp = split_table.set_index(["case", "deployment"])["TPOT p99 (ms)"]["long prompts, tight SLO"]
tt = split_table.set_index(["case", "deployment"])["TTFT p99 (ms)"]["long prompts, tight SLO"]
tp_mx = split_table.set_index(["case", "deployment"])["TPOT p99 (ms)"]["mixed, two GPUs"]
slow = split_table[split_table["case"] == "4x the KV, slow link"].set_index("deployment")
assert lp["1P3D nvlink"] > lp["4 x continuous"] and mx["1P1D nvlink"] < mx["2 x continuous"]
say(f"With long prompts and a tight TPOT limit, one prefill and three decode GPUs kept **{lp['1P3D nvlink']:.1%}** "
    f"within the limits against {lp['4 x continuous']:.1%} for four colocated replicas batching continuously: "
    f"the split removes the stall (TPOT p99 {tp['1P3D nvlink']:.1f} ms against {tp['4 x continuous']:.1f} ms), "
    f"though its one prefill GPU queues the long prompts (TTFT p99 {tt['1P3D nvlink'] / 1e3:.1f} s). "
    f"Chunked prefill, colocated, got {lp['4 x chunked']:.1%}: most of the gain "
    f"without a split. With `mixed` traffic on two GPUs the split loses: its one decode GPU kept "
    f"{mx['1P1D nvlink']:.1%} against {mx['2 x continuous']:.1%} colocated (TPOT p99 {tp_mx['1P1D nvlink']:.1f} ms "
    f"against {tp_mx['2 x continuous']:.1f} ms: all the decoding on one GPU). With four times the KV a token, the "
    f"Ethernet link took **{slow.loc['1P1D ethernet', 'transfer mean (ms)']:.1f} ms** a prompt on average against "
    f"{slow.loc['1P1D nvlink', 'transfer mean (ms)']:.2f} ms over NVLink (waits for the link up to "
    f"{slow.loc['1P1D ethernet', 'link wait max (ms)']:.0f} ms) and raised the TPOT p99 from "
    f"{slow.loc['1P1D nvlink', 'TPOT p99 (ms)']:.1f} to {slow.loc['1P1D ethernet', 'TPOT p99 (ms)']:.1f} ms; "
    f"{slow.loc['1P1D ethernet', 'within SLOs']:.1%} stayed within the limits, as over NVLink "
    f"({slow.loc['1P1D nvlink', 'within SLOs']:.1%}).")

# %% [markdown]
# `python bench/disaggregation.py` asks the same question with DistServe's goodput (the
# highest rate that keeps `90%` within the limits, found by bisection) over more cases;
# docs/FLEET.md has its table and its reading: in this simulator colocated chunked
# prefill beats every split it tried, and a split beats colocated continuous batching
# where long prompts stall the decodes.

# %% [markdown]
# ## 4. A capacity plan
#
# The service: Llama-3-8B, `mixed` chat traffic (prompts and outputs from a few dozen to
# a few thousand tokens), `40` requests/s, and the promise that at least `90%` of requests
# see their first token within `500` ms and then a token every `20` ms or faster. Which
# deployment is the cheapest that keeps it? `minilm/sim/search.py` (`python -m minilm
# capacity`) finds each candidate's capacity, the highest rate that keeps the promise, by
# bisection on the rate to `10%` (as Vidur-Search does), and ranks the candidates that reach
# the load by their price. Three shortcuts keep it cheap: the bisection starts from the cost
# model's estimate of the capacity, a run stops as soon as its verdict is certain (enough
# requests already missed, or met), and a candidate whose fastest possible decode step is
# slower than the TPOT promise is not run at all: its capacity reads `0 (bound)`. GPU prices are **assumptions**
# (`search.GPU_PRICES`, $/GPU-hour, as in lesson 7b), not quotes.

# %%
# NBVAL_CHECK_OUTPUT
from minilm.sim.search import GPU_PRICES, Ask, capacity_text, cheapest, deployment_space, rank, search, table_text

N_PLAN = 200
space = deployment_space(devices=("h100", "a100", "l40s"), layouts=("1", "2", "1:1"), policies=("chunked",))
service = Ask("llama-3-8b", "mixed", load=40.0, ttft_slo=0.5, tpot_slo=0.02, num_requests=N_PLAN, rel_tol=0.1)
plan = rank(service, search(service, space, workers=1))
print(f"{len(space)} deployments, {N_PLAN} requests a run; prices assumed: "
      + ", ".join(f"{k} ${GPU_PRICES[k]:.2f}/h" for k in ("h100", "a100", "l40s")))
print(table_text(plan))

# %% [stored]
widgets.capacity_figure(plan, service.load)

# %% [markdown]
# How does the answer move? Ask again with a tighter promise (TPOT `15` ms: a faster
# reader, or an agent that streams into another model), and with the same promise on
# `long-prompt` traffic (short chats with an occasional prompt of thousands of tokens).

# %%
# NBVAL_CHECK_OUTPUT
from dataclasses import replace

asks = {"the service": service, "TPOT 15 ms": replace(service, tpot_slo=0.015),
        "long-prompt traffic": replace(service, workload="long-prompt")}
plans = {"the service": plan} | {k: rank(a, search(a, space, workers=1)) for k, a in asks.items() if k != "the service"}
for k, rows_k in plans.items():
    c = cheapest(rows_k)
    capacity = {r["deployment"]: capacity_text(r) for r in rows_k}
    print(f"{k:20s}: cheapest {c['deployment'] if c else 'none meets it'}"
          + (f" at ${c['usd_per_hour']:.2f}/h, capacity {c['goodput_req_per_s']:.1f} req/s" if c else ""))
    print("    capacity (req/s): " + ", ".join(f"{d.split(' chunked')[0]} {v}" for d, v in capacity.items()))

# %%
# NBVAL_CHECK_OUTPUT
base, tight, longp = (cheapest(plans[k]) for k in asks)


def named(row) -> str:
    return row["deployment"].split(" chunked")[0] if row else "nothing in the space"


sentence = (f"For {service.load:g} req/s of `{service.workload}` within {service.ttft_slo * 1e3:.0f} ms / "
            f"{service.tpot_slo * 1e3:.0f} ms the cheapest is **{named(base)}** "
            f"(${base['usd_per_hour']:.2f}/h, capacity {base['goodput_req_per_s']:.1f} req/s). ")
was = next(r for r in plans["TPOT 15 ms"] if r["deployment"] == base["deployment"])
sentence += (f"A TPOT limit of {asks['TPOT 15 ms'].tpot_slo * 1e3:.0f} ms makes it **{named(tight)}**"
             + (f" (${tight['usd_per_hour']:.2f}/h)" if tight else "")
             + f": {named(base)} holds {capacity_text(was)} req/s within it. ")
was_long = next(r for r in plans["long-prompt traffic"] if r["deployment"] == base["deployment"])
sentence += (f"On `long-prompt` traffic it is **{named(longp)}**"
             + (f" (${longp['usd_per_hour']:.2f}/h)" if longp else "")
             + f": {named(base)} holds {capacity_text(was_long)} req/s of it. ")
sentence += (f"These runs hold {N_PLAN} requests each, which makes the search fast and the ranking rough: "
             "a short run at a high rate is a burst that ends before its queue grows, so it flatters fast "
             "deployments (docs/FLEET.md shows the answer changing at 10,000 requests a run). Plan with "
             "enough requests that a run at the capacity lasts many times the longest request.")
say(sentence)

# %% [markdown]
# ## 5. The same, for real
#
# Two of these deployments also run on this machine, with the lab's tiny `docstrings`
# model. `minilm serve --data-parallel-size 2` is section 1 in miniature: two engine-core
# processes, each its own model copy, scheduler and KV cache, behind one API process whose
# router (`minilm/router.py`, least outstanding by default, the policy section 1 used) picks a core for
# each request from the loads the cores report. `minilm serve --kv-transfer-config` is
# section 3's split: a prefill core and a decode core, each request's KV sent from one to
# the other over ZeroMQ (`minilm/serve/kv_transfer.py`). Each server below gets one CPU
# thread per engine core and one small burst of requests, and is stopped when its cell
# ends, even if the cell fails. These times are **measured** on this machine, not
# simulated: they change from run to run and machine to machine (docs/SERVING.md has the
# measured comparisons and what decides them).
#
# ### Two engine cores behind one server
#
# The chart is the live Gantt of lesson 9; given a server with several engine cores it
# polls each one (`GET /timeline?engine=I`) and draws a lane group per core, as section 1
# drew a replica's.

# %%
# NBVAL_IGNORE_OUTPUT
from IPython.display import display

from minilm import Timeline
from minilm.client import bench_serve
from minilm.client.process import ServerProcess

LIVE_PROMPTS, LIVE_TOKENS = 16, 16  # a burst of docstring prompts, all at once; tokens each (greedy)


async def burst(url: str) -> dict:
    return await bench_serve.run(url, "docstrings", LIVE_PROMPTS, rate=float("inf"), max_tokens=LIVE_TOKENS,
                                 ignore_eos=True, seed=0, quiet=True)


# `with`: the server is stopped (Ctrl-C, it drains) when the block ends, also on an error
with ServerProcess(data_parallel_size=2, cpu_threads=1, max_num_seqs=8) as server:
    two_cores = widgets.live_gantt(server.url, interval=0.5)
    display(two_cores)
    try:
        dp_result = await burst(server.url)
        await two_cores.refresh()  # the last records, after the burst
    finally:
        two_cores.stop()

# %%
# NBVAL_IGNORE_OUTPUT
split = [len(feed.finished) for feed in two_cores.feeds]  # requests each core finished
say(f"{dp_result['completed']} of {LIVE_PROMPTS} requests completed, "
    + ", ".join(f"{n} on engine core {i}" for i, n in enumerate(split))
    + f"; {dp_result['output_throughput']:.0f} output tokens/s, measured on this CPU.")

# %% [markdown]
# Each core took its share of the burst and ran its own batches, on its own clock
# (one time axis: the cores count from the same moment). Nothing passes between the two
# cores; the router alone decides the split, from what each core reported. Whether two
# cores served faster than one would have depends on whether this machine had a free CPU for
# each, which a shared laptop may not (bench/README.md, "Data-parallel engine cores").
#
# ### A disaggregated pair
#
# The same burst to a prefill core and a decode core. Each side writes its timeline when
# the server stops (`--timeline FILE` becomes `FILE` with `.prefill` and `.decode`), and
# the two are drawn on one time axis: the prefill core runs each prompt and computes its first
# token, then sends the request's KV; the transfer is a step on both sides' timelines, and
# on the decode side a request decodes only after its transfer has arrived and a seat is
# free (grey before a transfer: queued on the prefill core; after it: held for a seat).

# %%
# NBVAL_IGNORE_OUTPUT
import tempfile
from pathlib import Path

PAIR = Path(tempfile.mkdtemp(prefix="lesson11-")) / "pair.json"
with ServerProcess(kv_transfer_config='{"kv_connector": "ZmqConnector"}', cpu_threads=1, max_num_seqs=8,
                   timeline=PAIR) as pair:
    pair_result = await burst(pair.url)
sides = {side: Timeline.from_json(PAIR.with_suffix(f".{side}.json")) for side in ("prefill", "decode")}
moved = [s for s in sides["decode"].steps if s.items and s.items[0].kind == "transfer"]
say(f"{pair_result['completed']} of {LIVE_PROMPTS} requests completed; the prefill core ran "
    f"{len(sides['prefill'].steps)} steps, the decode core {len(sides['decode'].steps)}, of which "
    f"{len(moved)} took in a request's KV (median {np.median([s.t_end - s.t_start for s in moved]) * 1e3:.2f} ms "
    f"each, measured on this CPU).")

# %%
fig = widgets.compare_figure({f"{side} engine core": tl for side, tl in sides.items()})
fig.update_layout(title="A disaggregated pair: the prefill core, the decode core, the KV transfers between (measured)")

# %% [markdown]
# Here the link is a socket between two processes on one machine, so a transfer costs
# little next to a step; between GPUs on different machines it is section 3's link, priced
# by the KV's size. The lecture demo's third part starts both servers for a room.

# %% [markdown]
# ## What to take away
#
# * A router that counts requests, not work, fails as soon as lengths are skewed;
#   counting outstanding requests fixes most of it.
# * With prefix caching, where a request goes decides what its replica's cache is worth:
#   route by cached prefix, and bound the imbalance that buys.
# * Disaggregation helps where long prompts stall decodes under a tight TPOT limit, and
#   costs where the split leaves too few GPUs on one side; the link matters only when the
#   KV is large and the link slow. Chunked prefill takes much of its gain without a split.
# * A capacity plan is a search over deployments, each measured by bisection on the rate
#   against the SLOs; its answer moves with the promise and the traffic, and is only as
#   good as the length of the runs behind it.
#
# Exercise 11 asks you to write a router that passes all three traps of sections 1 and 2.
