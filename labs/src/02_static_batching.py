# %% [markdown]
# # 2 · Static batching
#
# The simplest way to batch: collect up to `max_num_seqs` requests, pad their prompts to
# the longest one, and run the batch until **every** row has finished. Then start the
# next batch. It is how `model.generate(batch)` works in most libraries.
#
# Think of a **group meal**: the table is served together and nobody leaves until the
# slowest eater is done; the next group waits outside until the whole table is free.
# Two kinds of waste follow:
#
# * **padding** — short prompts are padded to the longest, and a row that has finished
#   still occupies its place in every step until the longest row ends (a *bubble*);
# * **queueing** — a request that arrives while a batch runs waits for the whole batch.

# %% [markdown]
# ## 1. One static batch, step by step
#
# Four requests with different prompt and output lengths, one batch of 4.

# %%
# NBVAL_CHECK_OUTPUT
from minilm import Engine, RequestSpec, run_workload, summarize, make_workload
import widgets

specs = [RequestSpec("r0", [1] * 24, max_tokens=6), RequestSpec("r1", [1] * 8, max_tokens=2),
         RequestSpec("r2", [1] * 16, max_tokens=4), RequestSpec("r3", [1] * 4, max_tokens=3)]
tl = run_workload(specs, policy="static", max_num_seqs=4, sampling={"ignore_eos": True})
for s in tl.steps:
    print(f"step {s.step}: " + "  ".join(f"{i.request_id}:{i.kind[:3]}{i.num_tokens}" for i in s.items))

# %% [markdown]
# `pre` is prefill, `dec` decode, `pad` padding. Step 0 computes r1's 8 prompt tokens
# *plus* 16 padding tokens, so that every row is 24 long. After r1 has its 2 tokens, it
# keeps computing one padding token per
# step until r0, the slowest eater, is done. The Gantt chart shows the bubbles:

# %%
widgets.gantt_figure(tl)

# %% [markdown]
# ## 2. How much is wasted?
#
# Count the padding tokens the batch computed, split into prompt padding (step 0) and
# the bubbles of finished rows (later steps).

# %%
# NBVAL_CHECK_OUTPUT
items = tl.items_df()
pad = items[items.kind == "padding"]
prompt_pad = int(pad[pad.step == 0].num_tokens.sum())
bubble_pad = int(pad[pad.step > 0].num_tokens.sum())
computed = int(items.num_tokens.sum())
print(f"computed {computed} tokens: {prompt_pad} prompt padding + {bubble_pad} bubble padding "
      f"= {(prompt_pad + bubble_pad) / computed:.0%} wasted (summarize: {summarize(tl)['padding_fraction']:.0%})")

# %% [markdown]
# On a bigger workload the waste depends on how uneven the lengths are. The `mixed`
# preset has heavy-tailed lengths like real chat traffic (most short, a few long);
# `uniform` draws them evenly between 16 and 128.

# %%
# NBVAL_CHECK_OUTPUT
for preset in ("uniform", "mixed"):
    specs = make_workload(preset, num_requests=16, seed=0, max_model_len=512)
    m = summarize(run_workload(specs, policy="static", max_num_seqs=8, max_model_len=512,
                               sampling={"ignore_eos": True}))
    print(f"{preset:8s}: {m['steps']} steps, padding {m['padding_fraction']:.0%} of computed tokens, "
          f"mean real rows per step {m['mean_batch_size']:.2f} of 8")

# %% [markdown]
# Padding is not free: static batching really computes it (the engine runs padded rows
# like real ones), so it costs time. The share of this machine's measured time spent on
# padding, estimating each step's padding cost by its share of the step's tokens:

# %%
steps = tl.steps_df()
padding_time = (steps.duration * steps.padding_tokens / steps.num_tokens).sum()
print(f"{padding_time / steps.duration.sum():.0%} of the measured step time went to padding")

# %% [markdown]
# ## 3. Waiting for the table: queueing delay
#
# Now requests arrive over time (Poisson arrivals, 4 per second on average) and are
# served by Llama-3-8B on an H100 — **simulated** by the cost model, so the numbers are
# the same on every machine. A request that arrives mid-batch waits until the whole
# batch is done. Compare with in-flight batching (next lesson), which admits a request at
# the next step.

# %%
# NBVAL_CHECK_OUTPUT
from minilm.simulator import simulated_engine

def simulate(policy, specs, **knobs):
    engine = simulated_engine("llama-3-8b", "h100", policy=policy, **knobs)
    engine.add_workload(specs)
    return engine.run()

online = make_workload("mixed", num_requests=40, seed=1, rate=4.0, vocab_size=128256)
runs = {p: simulate(p, online, max_num_seqs=8) for p in ("static", "continuous")}
for p, t in runs.items():
    waits = [r.t_scheduled - r.arrival for r in t.requests]
    m = summarize(t)
    print(f"{p:10s}: queueing delay mean {sum(waits) / len(waits):6.2f} s, max {max(waits):6.2f} s; "
          f"TTFT p50 {m['ttft_p50']:6.2f} s (simulated)")

# %%
widgets.gantt_figure(runs["static"], title="static batching, Llama-3-8B on an H100 (simulated)")

# %% [markdown]
# **What to remember.** Static batching wastes compute on padding (uneven prompts, and
# rows that finished early) and makes new requests wait for the slowest member of the
# running batch. Orca (Yu et al., OSDI 2022) named the fix *iteration-level scheduling*:
# decide the batch again at every step. That is lesson 3.
#
# **Exercise 2** (`exercises/02_static_batching.ipynb`): predict the padding of a static
# batch from its lengths, and check your formula against the engine.
