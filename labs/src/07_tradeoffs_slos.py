# %% [markdown]
# # 7 · Trade-offs and SLOs
#
# A serving engine is tuned against a promise to its users, a **service-level
# objective (SLO)**: for example, the first token within 0.5 s (TTFT) and then a token
# at least every 10 ms on average (TPOT, time per output token). Throughput that breaks
# the promise is worth little; **goodput** counts only the requests that kept it
# (DistServe's definition). This lesson sweeps the batch size, finds the best setting
# under an SLO, and then tests four common misconceptions about in-flight batching, each
# with an experiment.
#
# Everything here is **simulated** (Llama-3-8B on an H100 in bfloat16, cost model of
# `minilm/costmodel.py`): the same scheduler as the real engine, step times predicted,
# identical on every machine.

# %%
from minilm import RequestSpec, make_workload, summarize
from minilm.simulator import simulated_engine
import widgets

def simulate(specs, policy="continuous", **knobs):
    engine = simulated_engine("llama-3-8b", "h100", policy=policy, **knobs)
    engine.add_workload(specs)
    return engine.run()

# %% [markdown]
# ## 1. Throughput against latency
#
# 600 `mixed` requests arriving at 300 per second; the knob is `max_num_seqs`, the most
# requests in flight.

# %%
# NBVAL_CHECK_OUTPUT
busy = make_workload("mixed", num_requests=600, seed=0, rate=300.0, vocab_size=128256)
sizes = [8, 32, 64, 128, 256]
table = widgets.sweep(lambda policy, **kw: simulate(busy, policy, **kw), ["continuous"], "max_num_seqs", sizes)
cols = ["value", "output_tok_per_s", "mean_batch_size", "ttft_p50", "ttft_p99", "tpot_p50"]
view = table[cols].rename(columns={"value": "max_num_seqs"})
view[["ttft_p50", "ttft_p99", "tpot_p50"]] *= 1e3  # ms
print(view.round(1).to_string(index=False))

# %%
widgets.sweep_figure(table, latency="tpot_p50")

# %% [markdown]
# More requests in flight means more tokens per step, so throughput rises — and each
# step is longer, so every request's tokens come more slowly (TPOT up). With too few in
# flight, requests queue and TTFT explodes.

# %% [markdown]
# ## 2. Goodput under an SLO
#
# SLO: TTFT ≤ 0.5 s and TPOT ≤ 10 ms. Which setting serves the most requests per second
# *within* it?

# %%
# NBVAL_CHECK_OUTPUT
TTFT_SLO, TPOT_SLO = 0.5, 0.010
rows = []
for n in sizes:
    m = summarize(simulate(busy, max_num_seqs=n), ttft_slo=TTFT_SLO, tpot_slo=TPOT_SLO)
    rows.append((n, m["output_tok_per_s"], m["slo_attainment"], m["goodput_req_per_s"]))
    print(f"max_num_seqs {n:3d}: {m['output_tok_per_s']:6.0f} tok/s, {m['slo_attainment']:4.0%} of requests "
          f"within the SLO, goodput {m['goodput_req_per_s']:6.1f} req/s")
best = max(rows, key=lambda r: r[3])
fastest = max(rows, key=lambda r: r[1])
print(f"best goodput at max_num_seqs={best[0]}; highest throughput at max_num_seqs={fastest[0]}")

# %% [markdown]
# The setting with the most throughput is not necessarily the one that keeps the most
# promises. Tighten or loosen the SLO above and watch the best setting move.

# %% [markdown]
# ## 3. Four misconceptions, four experiments
#
# ### (a) "In-flight batching is micro-batching"
#
# Micro-batching cuts work into smaller batches (pipeline parallelism does this to keep
# stages busy); each micro-batch is still formed once and runs to its end. In-flight
# batching is about *when* the batch changes — at every iteration — not about its size.
# Smaller or bigger static batches do not recover what iteration-level scheduling gains:

# %%
# NBVAL_CHECK_OUTPUT
offline = make_workload("mixed", num_requests=200, seed=0, vocab_size=128256)
for policy, n in [("static", 8), ("static", 32), ("static", 128), ("continuous", 32)]:
    m = summarize(simulate(offline, policy, max_num_seqs=n))
    print(f"{policy:10s} max_num_seqs {n:3d}: {m['output_tok_per_s']:6.0f} tok/s, "
          f"padding {m['padding_fraction']:4.0%}, mean real batch {m['mean_batch_size']:5.1f}")

# %% [markdown]
# ### (b) "In-flight batching makes each request faster"
#
# It raises throughput, not the latency of a single request. Alone on the GPU, a
# request takes the same time under every policy (chunking adds a hair: its 512-token
# prompt runs as two 256-token chunks, the default budget); under load, its inter-token latency
# *rises* with the batch it shares steps with (TPOT in section 1).

# %%
# NBVAL_CHECK_OUTPUT
alone = [RequestSpec("solo", [1] * 512, max_tokens=256)]
for policy in ("static", "continuous", "chunked"):
    r = simulate(alone, policy).requests[0]
    print(f"{policy:10s}: alone, end-to-end {(r.t_finished - r.arrival) * 1e3:7.1f} ms")
print("TPOT p50 by max_num_seqs under load:",
      {int(n): round(t * 1e3, 2) for n, t in zip(table.value, table.tpot_p50)}, "ms")

# %% [markdown]
# ### (c) "It speeds up everything"
#
# The gains come from **decode**. A prefill step is already compute-bound (lesson 1), so
# batching prompts together gains little; decode steps are memory-bound, and filling
# them is nearly free. 200 requests with 512-token prompts (all equal, so padding
# plays no part), once prefill-only (1 output token each) and once decode-heavy (the
# `mixed` preset's output lengths):

# %%
# NBVAL_CHECK_OUTPUT
prefill_only = [RequestSpec(s.id, [1] * 512, max_tokens=1) for s in offline]
decode_heavy = [RequestSpec(s.id, [1] * 512, max_tokens=s.max_tokens) for s in offline]
for name, specs in (("prefill-only", prefill_only), ("decode-heavy", decode_heavy)):
    tput = {p: summarize(simulate(specs, p, max_num_seqs=32))["total_tok_per_s"] for p in ("static", "continuous")}
    print(f"{name:12s}: continuous / static throughput (prompt + output tokens/s) = "
          f"{tput['continuous'] / tput['static']:.2f}")

# %% [markdown]
# ### (d) "Paged KV and in-flight batching are the same thing"
#
# They are complementary. In-flight batching decides *who* runs each step; paging
# decides *how much memory* each running request holds, and so how many can run. On a
# tight KV cache (512 blocks, 1 GiB), turn them on one at a time:

# %%
# NBVAL_CHECK_OUTPUT
for label, policy, mode in [("static (reserves its padded batch)", "static", "reserved"),
                            ("in-flight, reserved KV", "continuous", "reserved"),
                            ("in-flight + paged KV", "continuous", "paged")]:
    tl = simulate(offline, policy, kv_mode=mode, num_blocks=512, max_num_seqs=256)
    m = summarize(tl)
    print(f"{label:35s}: {m['output_tok_per_s']:6.0f} tok/s, mean batch {m['mean_batch_size']:5.1f}, "
          f"peak running {max(s.num_running for s in tl.steps):3d}")

# %% [markdown]
# In-flight scheduling removes padding and waiting; paging then turns the memory that
# reservation wasted into a bigger batch. Each gain needs the other to be fully used:
# without in-flight batching, blocks freed early cannot be given to anyone until the
# batch ends; without paging, the scheduler has free slots in the batch but no memory
# to fill them with.
#
# **What to remember.** Measure against the promise (goodput under an SLO), not raw
# throughput. Batch more to raise throughput, at the cost of per-token latency; chunk
# prompts (lesson 6) to keep that latency even; page the KV cache to afford the batch.
#
# **Exercise 7** (`exercises/07_tradeoffs_slos.ipynb`): compute goodput yourself.
