# %% [markdown]
# # 6 · Chunked prefill
#
# In-flight batching admits a new request at the next step — and runs its **whole
# prompt** in that step. A long prompt makes that one step long, and every request that
# was decoding waits for it: their next token is late. The output stalls; users see it
# as a hiccup in the stream of tokens, an **inter-token latency (ITL) spike**.
# Sarathi-Serve (Agrawal et al., OSDI 2024) calls this a *generation stall* and shows
# that schedulers which prioritise prefills cause it.
#
# The fix — Sarathi-Serve's *chunked prefill* with *stall-free batching*, DeepSpeed-
# FastGen's *Dynamic SplitFuse*, vLLM's default scheduler today — gives each step a
# **token budget** (`max_num_batched_tokens`): every running decode gets its token
# first, then prompts fill what is left, cut into **chunks** where they do not fit. A
# long prompt is spread over several steps, and no step is much longer than the others.

# %% [markdown]
# ## 1. A long prompt among decodes, on this machine
#
# The `long-prompt` workload: short requests that decode for a while, and one long
# prompt that arrives while they do. Same workload, in-flight batching without and with
# chunking (a 64-token budget). Times are measured on this machine.

# %%
# NBVAL_CHECK_OUTPUT
from minilm import make_workload, run_workload, summarize
from minilm.metrics import itls
import widgets

specs = make_workload("long-prompt", num_requests=12, seed=0, max_model_len=768, long_prompt_delay=0.02)
print("prompt lengths:", [len(s.prompt_ids) for s in specs])
knobs = dict(max_num_seqs=12, max_model_len=768, sampling={"ignore_eos": True})
tls = {"continuous": run_workload(specs, policy="continuous", **knobs),
       "chunked": run_workload(specs, policy="chunked", max_num_batched_tokens=64, **knobs)}

# %%
for p, tl in tls.items():
    m = summarize(tl)
    print(f"{p:10s}: ITL p50 {m['itl_p50'] * 1e3:6.1f} ms, max {max(itls(tl)) * 1e3:6.1f} ms; "
          f"{m['output_tok_per_s']:5.0f} output tok/s (measured)")

# %%
widgets.compare_figure(tls)

# %% [markdown]
# In the continuous run, one step carries the long prompt, and every decoding request's
# bar has a gap there. In the chunked run, the prompt runs in 64-token pieces alongside
# the decodes. The ITL distributions:

# %%
widgets.latency_cdfs_figure(tls)

# %% [markdown]
# ## 2. The seed's example: an 8k prompt against 60 decodes on an H100 (simulated)
#
# 60 requests are decoding on Llama-3.1-8B (Llama 3's sizes, trained to long contexts, so
# an 8k prompt and its output fit) on an H100 (bfloat16) when one 8,192-token prompt arrives. Without chunking, the step that runs it holds all 8,192 tokens; with a
# 512-token budget it is cut into 16 chunks. These are the cost model's predictions.

# %%
# NBVAL_CHECK_OUTPUT
from minilm import RequestSpec
from minilm.simulator import simulated_engine

def seed_example(policy, **knobs):
    engine = simulated_engine("llama-3.1-8b", "h100", policy=policy, max_num_seqs=64, max_model_len=8448, **knobs)
    specs = [RequestSpec(f"d{i}", [1] * 256, max_tokens=400) for i in range(60)]
    specs.append(RequestSpec("long", [1] * 8192, max_tokens=32, arrival=1.0))
    engine.add_workload(specs)
    return engine.run()

seed_runs = {"continuous": seed_example("continuous"),
             "chunked, budget 512": seed_example("chunked", max_num_batched_tokens=512)}
for name, tl in seed_runs.items():
    gaps = [b - a for r in tl.requests if r.request_id != "long" for a, b in zip(r.token_times, r.token_times[1:])]
    long = next(r for r in tl.requests if r.request_id == "long")
    print(f"{name:20s}: decodes stall up to {max(gaps) * 1e3:6.1f} ms (typical ITL {sorted(gaps)[len(gaps) // 2] * 1e3:4.1f} ms); "
          f"the long prompt's TTFT {(long.t_first_token - long.arrival) * 1e3:6.1f} ms (simulated)")

# %%
import plotly.graph_objects as go

fig = go.Figure()
for name, tl in seed_runs.items():
    df = tl.steps_df()
    window = df[(df.t_start > 0.95) & (df.t_start < 1.3)]
    fig.add_scatter(x=window.t_start, y=window.duration * 1e3, name=name, mode="lines+markers", line_shape="hv")
fig.update_layout(xaxis_title="time (s, simulated)", yaxis_title="step duration (ms)", height=350,
                  title="steps around the 8k prompt's arrival (Llama-3-8B, H100, simulated)")
fig

# %% [markdown]
# The decodes' worst gap shrinks to a couple of ordinary steps; the long prompt pays a
# little: its first token comes later, because its chunks share steps with the decodes
# and each chunk re-reads the chunks before it from the KV cache.

# %% [markdown]
# ## 3. The budget trades TTFT against ITL
#
# A small budget keeps every step short (low ITL) but spreads prompts over many steps,
# and every step re-reads all the weights (lesson 1): too small, and TTFT and throughput
# suffer. A big budget does the opposite and, at the limit, is plain in-flight batching.
# 96 requests of the `long-prompt` preset (6 prompts of 4–6k tokens)
# arriving at 30 per second, Llama-3-8B on an H100 (simulated):

# %%
# NBVAL_CHECK_OUTPUT
import pandas as pd

online = make_workload("long-prompt", num_requests=96, seed=0, max_model_len=8192, rate=30.0, vocab_size=128256)
rows = []
for policy, budget in [("continuous", None)] + [("chunked", b) for b in (64, 128, 256, 512, 1024, 2048, 4096)]:
    engine = simulated_engine("llama-3-8b", "h100", policy=policy, max_num_seqs=64, max_model_len=8192,
                              max_num_batched_tokens=budget)
    engine.add_workload(online)
    tl = engine.run()
    m = summarize(tl)
    rows.append({"policy": policy, "knob": "budget", "value": budget or 8192, "ttft_p50": m["ttft_p50"],
                 "ttft_p99": m["ttft_p99"], "itl_p50": m["itl_p50"], "itl_max": max(itls(tl)),
                 "output_tok_per_s": m["output_tok_per_s"], "clock": m["clock"]})
sweep = pd.DataFrame(rows)
ms = sweep[["ttft_p50", "ttft_p99", "itl_p50", "itl_max"]] * 1e3
print(pd.concat([sweep[["policy", "value"]], ms.round(1), sweep.output_tok_per_s.round(0)], axis=1)
      .rename(columns={"value": "budget"}).to_string(index=False))

# %%
widgets.sweep_figure(sweep, latency="itl_max")

# %% [markdown]
# Read the table from the top: the smallest budgets spend so many steps on each prompt
# that TTFT and throughput collapse. From a few hundred tokens on, the worst ITL grows
# with the budget while TTFT p99 mostly falls. In this run the mid-size budgets also
# give *more* throughput than no chunking: the decodes keep running while long prompts
# are prefilled, instead of waiting for them (the Sarathi papers call this
# *piggybacking* decodes on prefill chunks). Where to set the budget depends on what you
# promise users (lesson 7).
# vLLM's documentation suggests a budget near 2048 for low inter-token latency and above
# 8192 for throughput. Sarathi-Serve reports up to 2.6x the serving capacity of vLLM for
# Mistral-7B on one A100 under latency SLOs, and DeepSpeed-FastGen up to 2.3x the
# effective throughput of vLLM (their settings; not measured here).
#
# **Exercise 6** (`exercises/06_chunked_prefill.ipynb`): write the chunk-splitting rule
# and check it against the engine, step by step.
