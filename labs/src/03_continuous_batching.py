# %% [markdown]
# # 3 · In-flight (continuous) batching
#
# Orca (Yu et al., OSDI 2022) changed one thing: the batch is decided **at every step**
# (*iteration-level scheduling*) instead of once per batch. Every step the engine runs
# the same loop:
#
# 1. **check** — which requests are running, and did any finish in the last step?
# 2. **evict** — finished requests leave the batch at once and free their KV memory;
# 3. **fill** — requests waiting in the queue take the free places;
# 4. **execute** — one model step over the batch: the prompts of the new arrivals and one
#    decode token for everybody else.
#
# The picture is a **rotating sushi bar**: guests sit down the moment a seat is free and
# leave when they are full; nobody waits for the slowest eater. vLLM, TensorRT-LLM
# ("in-flight batching"), SGLang and Hugging Face TGI all schedule this way.

# %% [markdown]
# ## 1. The loop, one step at a time
#
# Six requests, at most 3 running at once. We call `engine.step()` ourselves and print
# who ran in each step.

# %%
# NBVAL_CHECK_OUTPUT
from minilm import Engine, make_workload, run_workload, summarize
import widgets

engine = Engine("tiny", policy="continuous", max_num_seqs=3)
for i, n_out in enumerate([2, 5, 3, 4, 2, 3]):
    engine.add_request(f"r{i}", prompt_ids=[1] * (4 + 2 * i), max_tokens=n_out, ignore_eos=True)
while engine.has_unfinished():
    s = engine.step()
    ran = "  ".join(f"{i.request_id}:{i.kind[:3]}{i.num_tokens}" for i in s.items)
    print(f"step {s.step}: running {s.num_running}, waiting {s.num_waiting} | {ran}")

# %% [markdown]
# Follow r0: its prompt runs in step 0 together with r1's and r2's, it decodes in step 1
# and is done. In step 2, r3 **fills** its place: r3's prompt runs in the same step as the
# decodes of r1 and r2. A step can mix prefill and decode work (Orca's *selective
# batching*: the token-wise parts of the model — projections, MLP — run on all tokens
# together; attention is done per sequence).

# %%
widgets.gantt_figure(engine.timeline)

# %% [markdown]
# ## 2. Effective batch size over time
#
# The **effective batch size** is how many requests do real work in a step. Static
# batching lets it sag as rows finish; in-flight batching refills it at once. Same
# 24-request workload, same `max_num_seqs=8`:

# %%
# NBVAL_CHECK_OUTPUT
specs = make_workload("mixed", num_requests=24, seed=0, max_model_len=512)
knobs = dict(max_num_seqs=8, max_model_len=512, sampling={"ignore_eos": True})
tls = {p: run_workload(specs, policy=p, **knobs) for p in ("static", "continuous")}
for p, t in tls.items():
    m = summarize(t)
    print(f"{p:10s}: {m['steps']} steps, mean effective batch {m['mean_batch_size']:.2f}, "
          f"padding {m['padding_fraction']:.0%}")

# %%
import plotly.graph_objects as go

fig = go.Figure()
for p, t in tls.items():
    df = t.steps_df()
    fig.add_scatter(x=df.step, y=df.batch_size, name=p, mode="lines", line_shape="hv")
fig.update_layout(xaxis_title="step", yaxis_title="requests doing real work", height=350)
fig

# %% [markdown]
# ## 3. Throughput ≈ effective batch size × steps per second
#
# Each decode step yields one token per running request, so output throughput is about
# the mean effective batch size times the number of steps per second. Both sides
# from the measured timeline:

# %%
for p, t in tls.items():
    m = summarize(t)
    steps_per_s = m["steps"] / m["wall_s"]
    print(f"{p:10s}: {m['mean_batch_size']:.2f} x {steps_per_s:.0f} steps/s = "
          f"{m['mean_batch_size'] * steps_per_s:.0f}; measured {m['output_tok_per_s']:.0f} output tokens/s")

# %% [markdown]
# Every request that does real work in a step samples one token (a step that completes a
# prompt samples its first token), so the two sides agree. In-flight batching raises the first factor. It pays for it in the second: a fuller
# step is a slower step — though far less than proportionally, as lesson 1 showed.

# %% [markdown]
# ## 4. The on/off experiment
#
# The same workload with in-flight batching off (`static`) and on (`continuous`), shown
# on a shared time axis: where does each run finish?

# %%
widgets.compare_figure(tls)

# %%
ratio = summarize(tls["continuous"])["output_tok_per_s"] / summarize(tls["static"])["output_tok_per_s"]
print(f"measured on this machine: continuous batching gives {ratio:.1f}x the output tokens/s of static")

# %% [markdown]
# And on a GPU (simulated: Llama-3-8B on an H100, 200 `mixed` requests arriving at 50
# per second, up to 64 running):

# %%
# NBVAL_CHECK_OUTPUT
from minilm.simulator import simulated_engine

online = make_workload("mixed", num_requests=200, seed=0, rate=50.0, vocab_size=128256)
sim = {}
for p in ("static", "continuous"):
    engine = simulated_engine("llama-3-8b", "h100", policy=p, max_num_seqs=64)
    engine.add_workload(online)
    sim[p] = summarize(engine.run())
for p, m in sim.items():
    print(f"{p:10s}: {m['output_tok_per_s']:7.0f} output tok/s, TTFT p50 {m['ttft_p50'] * 1e3:7.1f} ms, "
          f"e2e p50 {m['e2e_p50']:6.2f} s (simulated)")

# %% [markdown]
# **What to remember.** Scheduling per iteration keeps the batch full and lets a new
# request start at the next step. The Orca paper reports 36.9x the throughput of
# NVIDIA FasterTransformer at the same latency for GPT-3 175B (their setting, not
# measured here); the factor you get depends on how uneven the lengths are and on
# how loaded the server is — try `uniform` against `mixed` above.
#
# **Exercise 3** (`exercises/03_continuous_batching.ipynb`): write this policy yourself,
# as a `Policy` class with a `schedule` method, and check it step by step against the
# engine's.
