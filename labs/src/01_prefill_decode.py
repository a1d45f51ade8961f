# %% [markdown]
# # 1 · Prefill vs decode
#
# An LLM request runs in two phases:
#
# * **prefill** — the whole prompt of N tokens goes through the model in one step. All N
#   tokens are processed in parallel, and the step writes their keys and values into
#   the KV cache. It ends by sampling the first output token.
# * **decode** — every later step feeds in only the newest token (1 per sequence),
#   attends to everything cached, and samples the next one.
#
# They cost very differently, and that difference is why batching works. This lesson
# counts it (FLOPs and bytes), measures it on this machine, and shows it on a real GPU
# with the simulated clock.

# %% [markdown]
# ## 1. One request, two phases
#
# One request with a 512-token prompt and 16 output tokens on the `tiny` model.
# Step 0 is the prefill; every other step is a decode. (Times are measured here, so they
# change a little from run to run.)

# %%
from minilm import Engine
import widgets

engine = Engine("tiny")
engine.add_request("r0", prompt_ids=[7] * 512, max_tokens=16, ignore_eos=True)
tl = engine.run()
steps = tl.steps_df()
prefill_ms = steps.duration[0] * 1e3
decode_ms = steps.duration[1:].median() * 1e3
print(f"prefill of 512 tokens: {prefill_ms:.1f} ms; one decode step: {decode_ms:.2f} ms "
      f"({prefill_ms / decode_ms:.0f}x longer for 512x the tokens)")

# %%
widgets.steps_figure(tl)

# %% [markdown]
# The prefill processed 512 times more tokens but did not take 512 times longer. A
# decode step does very little arithmetic yet still costs a noticeable time. Why?

# %% [markdown]
# ## 2. Counting: FLOPs and bytes
#
# A Llama layer's linear maps (q, k, v, o projections and the SwiGLU MLP) hold most of the
# parameters, and each parameter does one multiply and one add per token:
#
# $$\text{FLOPs}_\text{prefill} \approx 2 \cdot N \cdot P, \qquad P \approx L \cdot 12 d^2
# \text{ (GPT-style layer; Llama's GQA and wider MLP change the 12)}$$
#
# so prefill costs ~ 2·N·P, that is about 24·N·L·d² — linear in the tokens. A decode step
# of a batch of B sequences does 2·B·P FLOPs, but it must **read every weight once**
# plus every cached key and value of every sequence:
#
# $$\text{bytes}_\text{decode} \approx \underbrace{P \cdot b}_\text{weights}
# + \underbrace{2 \cdot L \cdot H_{kv} \cdot D \cdot b}_\text{KV bytes per token} \cdot \sum_i c_i$$
#
# (b bytes per number, c_i the context of sequence i). The ratio FLOPs / bytes is the
# step's **arithmetic intensity**. The cost model in `minilm/costmodel.py` writes these
# formulas out exactly (attention FLOPs included); here are its counts for the lab's
# `tiny` model and for Llama-3-8B in bfloat16.

# %%
# NBVAL_CHECK_OUTPUT
from minilm.costmodel import CostModel

for name, device in (("tiny", "cpu"), ("llama-3-8b", "h100")):
    cm = CostModel(name, device)
    print(f"{name}: {cm.model.num_params / 1e6:,.1f} M parameters, {cm.weight_bytes / 1e6:,.1f} MB of weights read "
          f"per step, {cm.kv_bytes_per_token / 1e3:,.1f} KB of KV per token ({cm.dtype})")
    for label, shape in (("prefill N=2048", [(2048, 2048)]), ("decode B=1, ctx 2048", [(1, 2048)]),
                         ("decode B=64, ctx 2048", [(1, 2048)] * 64)):
        c = cm.cost(shape)
        print(f"  {label:22s} {c.flops / 1e9:12,.1f} GFLOP {c.bytes / 1e9:9,.3f} GB "
              f"intensity {c.flops / c.bytes:8,.1f} FLOP/byte")

# %% [markdown]
# Prefill does thousands of FLOPs per byte it reads; decode at batch 1 does about one
# (2 FLOPs per 2-byte bfloat16 weight). Batching 64 decodes multiplies the FLOPs by 64
# while the weights are still read once — but the KV cache grows with the batch.

# %% [markdown]
# ## 3. Measured on this machine: step time against tokens in the step
#
# Now measure. One engine runs prompts of growing length one at a time (each prefill
# alone in its step), then batches of B requests decoding together. We keep the best of
# three runs of each, the usual way to time on a busy machine.

# %%
import numpy as np

def best_prefill_ms(engine, n, repeats=3):
    times = []
    for r in range(repeats):
        engine.add_request(f"p{n}-{r}", prompt_ids=[7] * n, max_tokens=1, ignore_eos=True)
        times.append(engine.run().steps[-1].duration)
    return min(times) * 1e3

def best_decode_ms(batch, repeats=3):
    engine = Engine("tiny", max_num_seqs=batch)
    for i in range(batch):
        engine.add_request(f"d{i}", prompt_ids=[7] * 16, max_tokens=2 + repeats, ignore_eos=True)
    steps = engine.run().steps_df()
    return steps[steps.decode_tokens == batch].duration.min() * 1e3

engine = Engine("tiny")
best_prefill_ms(engine, 8)  # warm-up
prefill = {n: best_prefill_ms(engine, n) for n in (16, 64, 256, 1024)}
decode = {b: best_decode_ms(b) for b in (1, 4, 16, 64)}
for n, ms in prefill.items():
    print(f"prefill {n:5d} tokens: {ms:7.2f} ms  ({ms / n * 1e3:6.1f} us per token)")
for b, ms in decode.items():
    print(f"decode  batch {b:3d}: {ms:7.2f} ms  ({ms / b * 1e3:6.1f} us per token)")

# %%
import plotly.graph_objects as go

fig = go.Figure()
fig.add_scatter(x=list(prefill), y=list(prefill.values()), name="prefill (N tokens, 1 sequence)", mode="lines+markers")
fig.add_scatter(x=list(decode), y=list(decode.values()), name="decode (B sequences, 1 token each)", mode="lines+markers")
fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="tokens in the step",
                  yaxis_title="step time (ms, measured on this machine)", height=380)
fig

# %% [markdown]
# On a CPU, most of a small step is fixed cost (Python, launching each operation) and the
# cost per token falls steeply as a step holds more tokens: batching decodes makes each
# token cheaper. It stops falling once the arithmetic takes over — and a long prompt's
# attention grows as N², so the longest prefill can even cost more per token.

# %% [markdown]
# ## 4. The roofline of a real GPU (simulated)
#
# A GPU step takes at least `FLOPs / peak FLOP/s` (compute) and at least
# `bytes / bandwidth` (memory): whichever is larger wins. The **ridge point**
# `peak / bandwidth` is the intensity where they meet (H100 SXM: 989 TFLOP/s dense bf16 and
# 3.35 TB/s, from its datasheet: ~295 FLOP/byte). Below it a step is memory-bound, above it
# compute-bound. These numbers are the cost model's predictions for Llama-3-8B on an H100,
# not measurements.

# %%
# NBVAL_CHECK_OUTPUT
cm = CostModel("llama-3-8b", "h100")
points = [("prefill", n, cm.cost([(n, n)])) for n in (16, 64, 256, 1024, 4096)]
points += [("decode", b, cm.cost([(1, 1024)] * b)) for b in (1, 8, 64, 256)]
ridge = cm.flop_rate / cm.byte_rate
print(f"ridge point with the model's efficiency factors: {ridge:.0f} FLOP/byte")
for kind, n, c in points:
    roof_ms = max(c.compute_s, c.memory_s) * 1e3
    print(f"{kind:7s} {'N' if kind == 'prefill' else 'B'}={n:5d}: intensity {c.flops / c.bytes:7.1f} FLOP/byte, "
          f"{roof_ms:7.3f} ms, {c.bound}-bound")

# %%
x = np.logspace(-0.5, 4, 100)
fig = go.Figure()
fig.add_scatter(x=x, y=np.minimum(cm.flop_rate, x * cm.byte_rate) / 1e12, name="roofline", line_color="gray")
for kind in ("prefill", "decode"):
    pts = [(c.flops / c.bytes, c.flops / max(c.compute_s, c.memory_s) / 1e12, n) for k, n, c in points if k == kind]
    fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], text=[str(p[2]) for p in pts],
                    mode="markers+text", textposition="top left", name=kind)
fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="arithmetic intensity (FLOP/byte)",
                  yaxis_title="attained TFLOP/s", title="Llama-3-8B on an H100 (simulated)", height=420)
fig

# %% [markdown]
# **What to remember.** Prefill is compute-bound: its cost grows with the prompt.
# Decode is memory-bound: a decode step of one sequence reads all ~15 GB of its weights to
# make one token, and the GPU's arithmetic sits idle. Batching many sequences' decode
# tokens into one step shares that weight read — the whole reason serving engines batch.
# The next lessons are about *how* to batch.
#
# **Exercise 1** (`exercises/01_prefill_decode.ipynb`): write the roofline estimate yourself.
