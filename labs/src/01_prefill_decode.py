# %% [markdown]
# # 1 · Prefill vs decode
#
# An LLM request runs in two phases:
#
# * **prefill** — the whole prompt of N tokens goes through the model in one step. All N
#   tokens are processed in parallel, and the step writes their keys and values into
#   the KV cache. It ends by sampling the first output token.
# * **decode** — every later step feeds in only the newest token (one per sequence),
#   attends to everything cached, and samples the next one.
#
# They cost very differently, and that difference is why batching works. This lesson
# counts it (FLOPs and bytes), measures it on this machine, shows it on a real GPU with
# the simulated clock, and finds where a step turns from memory-bound to compute-bound:
# the number that decides how big a chunked-prefill budget should be (lesson 6).

# %% [markdown]
# ## 1. One request, two phases
#
# One request on the `tiny` model: step 0 is the prefill, every other step a decode.
# Times are measured on this machine, so they change a little from run to run.

# %%
from minilm import Engine, steps_df
from labs.prose import check, say
import widgets

PROMPT_LEN, OUTPUT_LEN = 512, 16
engine = Engine("tiny")
engine.add_request("r0", prompt_ids=[7] * PROMPT_LEN, max_tokens=OUTPUT_LEN, ignore_eos=True)
tl = engine.run()
steps = steps_df(tl)
steps.assign(**{"duration (ms)": steps.duration * 1e3})[["step", "prefill_tokens", "decode_tokens",
                                                         "duration (ms)"]].round(2).head(4)

# %%
prefill_ms = steps.duration[0] * 1e3
decode_ms = steps.duration[1:].min() * 1e3  # the fastest: a busy machine only ever adds time
say(f"A prompt of **{PROMPT_LEN}** tokens, then **{OUTPUT_LEN}** output tokens (measured here): the prefill "
    f"step took **{prefill_ms:.1f} ms**, the fastest decode step **{decode_ms:.2f} ms** (the median "
    f"{steps.duration[1:].median() * 1e3:.2f} ms). The prefill computed {PROMPT_LEN}x the tokens of a decode step "
    f"in {prefill_ms / decode_ms:.0f}x its time.")

# %%
widgets.steps_figure(tl)

# %% [markdown]
# The prefill computed many times the tokens of a decode step, but its time did not grow
# in proportion; a decode step does almost no arithmetic, yet costs a noticeable time.
# Why?

# %% [markdown]
# ## 2. Counting: FLOPs and bytes
#
# A Llama layer's linear maps (the q, k, v, o projections and the **SwiGLU** MLP: a gate
# and an up projection, multiplied element by element after the gate's SiLU, then a down
# projection, three matrices where GPT's MLP has two) hold most
# of the parameters, and each parameter takes part in one multiply and one add per token:
#
# $\displaystyle \text{FLOPs}_\text{prefill} \approx 2 \cdot N \cdot P, \qquad
# P \approx L \cdot 12 d^2 \;\Rightarrow\; \text{FLOPs}_\text{prefill} \approx 24 \cdot N \cdot L \cdot d^2$
#
# ($12 d^2$ per layer is the GPT-style layer: $4 d^2$ in q, k, v, o and $8 d^2$ in an MLP of
# width $4d$; Llama's wider MLP and *grouped-query attention*, where several query heads
# share one key/value head (lesson 5), move the $12$ a little), plus attention, which grows
# with $N^2$. A decode step of a batch of B sequences does $2 \cdot B \cdot P$ FLOPs, but it
# must **read every weight once** plus every cached key and value of every sequence:
#
# $\displaystyle \text{bytes}_\text{decode} \approx \underbrace{P \cdot b}_\text{weights}
# + \underbrace{2 \cdot L \cdot H_{kv} \cdot D \cdot b}_\text{KV bytes per token} \cdot \sum_i c_i$
#
# ($b$ bytes per number, $c_i$ the context of sequence $i$). FLOPs / bytes is the step's
# **arithmetic intensity**.
#
# Source `000`'s prefill box writes $\text{FLOPs} \approx 2 \times N \times L \times d^2$.
# PyTorch's FLOP counter watches one real prefill step of the `tiny` model (its layer has
# exactly $12 d^2$ weights):

# %%
# NBVAL_CHECK_OUTPUT
from torch.utils.flop_counter import FlopCounterMode
from minilm.sim.costmodel import CostModel

N = 512
counted = Engine("tiny")
counted.add_request("count", prompt_ids=[7] * N, max_tokens=1, ignore_eos=True)  # one prefill step, nothing else
with FlopCounterMode(display=False) as counter:
    counted.run()
ops = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
linear = ops.get("aten.mm", 0) + ops.get("aten.addmm", 0)  # the linear layers are plain matrix multiplies
cfg = counted.model_config
L, d, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
lm_head = 2 * d * V  # the output layer runs once per sequence: only the last token's logits are needed
print(f"tiny model: L = {L} layers, d = {d}, prefill of N = {N} tokens")
print(f"  counted in the linear layers' matmuls   {linear:>13,} FLOPs")
print(f"  24·N·L·d² + the output layer (2·d·V)    {24 * N * L * d * d + lm_head:>13,} FLOPs")
print(f"  the source's 2·N·L·d²                   {2 * N * L * d * d:>13,} FLOPs")
assert linear == 24 * N * L * d * d + lm_head  # if the model changes shape, this lesson's text must too

# %%
llama = CostModel("llama-3-8b", "h100")
per_layer = llama.linear_params / (llama.model.num_hidden_layers * llama.model.hidden_size ** 2)
attention = CostModel("tiny", "cpu").cost([(N, N)]).attention_flops  # causal: token j sees j + 1 keys
say(check("000", "Prefill FLOPs ≈ 2·N·L·d², in the same box that counts $L \\times 12 d^2$ weights read.",
          f"The two cannot both hold: $12 d^2$ weights per layer at 2 FLOPs each per token is "
          f"$24 \\cdot N \\cdot L \\cdot d^2$, and the counter agrees with that to the FLOP (plus the output "
          f"layer for the last token): the source's formula is **{linear / (2 * N * L * d * d):.0f}x too small**. "
          f"(Llama-3-8B's linear layers hold {per_layer:.1f}·d² per layer: {2 * per_layer:.0f}·N·L·d² for it.) "
          f"Attention comes on top: {attention:,.0f} FLOPs for this prompt by the cost model's count, "
          f"{attention / linear:.0%} of the linear layers' share, and growing with N²."))

# %% [markdown]
# The cost model in `minilm/sim/costmodel.py` writes these formulas out exactly (attention
# FLOPs and KV writes included); here are its counts for the lab's `tiny` model and for
# Llama-3-8B in bfloat16.

# %%
# NBVAL_CHECK_OUTPUT
shapes = (("prefill N=2048", [(2048, 2048)]), ("decode B=1, ctx 2048", [(1, 2048)]),
          ("decode B=64, ctx 2048", [(1, 2048)] * 64))
intensity = {}
for name, device in (("tiny", "cpu"), ("llama-3-8b", "h100")):
    cm = CostModel(name, device)
    print(f"{name}: {cm.model.num_params / 1e6:,.1f} M parameters, {cm.weight_bytes / 1e6:,.1f} MB of weights read "
          f"per step, {cm.kv_bytes_per_token / 1e3:,.1f} KB of KV per token ({cm.dtype})")
    for label, shape in shapes:
        c = cm.cost(shape)
        intensity[name, label] = c.flops / c.bytes
        print(f"  {label:22s} {c.flops / 1e9:12,.1f} GFLOP {c.bytes / 1e9:9,.3f} GB "
              f"intensity {c.flops / c.bytes:8,.1f} FLOP/byte")

# %%
pre, one, many = (intensity["llama-3-8b", label] for label, _ in shapes)
say(f"A prefill of 2,048 tokens does **{intensity['tiny', shapes[0][0]]:,.0f}** (tiny, float32) and "
    f"**{pre:,.0f}** (Llama-3-8B, bfloat16) FLOPs per byte it moves; a decode step of one sequence "
    f"does **{one:.1f}**: two FLOPs per two-byte weight. Batching 64 decodes multiplies the FLOPs by 64, "
    f"but the intensity only by {many / one:.0f}, to {many:.1f}: the weights are still read once, "
    f"but every sequence adds its own KV cache to the bytes.")

# %% [markdown]
# ## 3. Measured on this machine: step time against tokens in the step
#
# Now measure. One engine runs prompts of growing length one at a time (each prefill
# alone in its step), then batches of B requests decoding together. We keep the fastest
# of three runs of each prompt, and of three decode steps of each batch: the usual way to
# time on a busy machine.

# %%
import numpy as np

def best_prefill_ms(engine, n, repeats=3):
    times = []
    for r in range(repeats):
        engine.add_request(f"p{n}-{r}", prompt_ids=[7] * n, max_tokens=1, ignore_eos=True)
        times.append(engine.run().steps[-1].duration)
    return min(times) * 1e3

def best_decode_ms(batch, context=16, repeats=3):
    engine = Engine("tiny", max_num_seqs=batch)
    for i in range(batch):
        engine.add_request(f"d{i}", prompt_ids=[7] * context, max_tokens=2 + repeats, ignore_eos=True)
    steps = steps_df(engine.run())
    return steps[steps.decode_tokens == batch].duration.min() * 1e3

engine = Engine("tiny")
best_prefill_ms(engine, 8)  # warm-up
prefill = {n: best_prefill_ms(engine, n) for n in (16, 64, 256, 1024)}
decode = {b: best_decode_ms(b) for b in (1, 4, 16, 64)}
long_context = best_decode_ms(1, context=PROMPT_LEN)  # section 1's context
for n, ms in prefill.items():
    print(f"prefill {n:5d} tokens: {ms:7.2f} ms  ({ms / n * 1e3:6.1f} us per token)")
for b, ms in decode.items():
    print(f"decode  batch {b:3d}: {ms:7.2f} ms  ({ms / b * 1e3:6.1f} us per token), 16 tokens of context")
print(f"decode  batch   1: {long_context:7.2f} ms, {PROMPT_LEN} tokens of context (fastest of 3 steps, each)")

# %%
import plotly.graph_objects as go

fig = go.Figure()
fig.add_scatter(x=list(prefill), y=list(prefill.values()), name="prefill (N tokens, 1 sequence)", mode="lines+markers")
fig.add_scatter(x=list(decode), y=list(decode.values()), name="decode (B sequences, 1 token each)", mode="lines+markers")
fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="tokens in the step",
                  yaxis_title="step time (ms, measured on this machine)", height=380)
fig

# %%
p = {n: ms / n * 1e3 for n, ms in prefill.items()}  # us per token
dd = {b: ms / b * 1e3 for b, ms in decode.items()}
growth = decode[16] / decode[1]
assert growth < 16 / 2  # "far less" below
say(f"Per token, a decode step alone costs **{dd[1]:.0f} us**, one in a batch of {max(dd)} **{dd[max(dd)]:.0f} "
    f"us**; a prefill token costs {p[min(p)]:.1f} us in a {min(p)}-token prompt and {p[max(p)]:.1f} us in a "
    f"{max(p):,}-token one (measured here). A decode step of 16 sequences took **{growth:.1f}x** the time of "
    f"one of a single sequence: 16 times the tokens, far less than 16 times the time.")

# %%
cpu = CostModel("tiny", "cpu")  # this lab's CPU model, fitted by bench/calibrate_cpu.py
short, long = cpu.cost([(1, 17)]), cpu.cost([(1, PROMPT_LEN + 1)])
say(f"The lab's CPU cost model (fitted to steps measured on the machine the lab was built on) splits a "
    f"one-sequence decode step into **{short.overhead_s * 1e3:.1f} ms** of fixed cost, "
    f"{short.memory_s * 1e3:.2f} ms of reading the weights and {short.compute_s * 1e3:.2f} ms of arithmetic. "
    f"Section 1's decode steps ran with {PROMPT_LEN} tokens of context: the fastest took {decode_ms:.2f} ms there, "
    f"and {long_context:.2f} ms here, against {decode[1]:.2f} ms with 16 tokens of context. The cost model "
    f"prices the longer context's keys and values, read and attended at every step, at "
    f"{(long.time - short.time) * 1e3:.2f} ms more. The rest is how it was measured: section 1 ran first in a "
    f"fresh process, with no warm-up run before it, and a median on a shared machine also carries whatever else "
    f"the machine was doing. Compare fastest with fastest, measured the same way.")

# %% [markdown]
# So on this CPU, what makes a small step cost "a noticeable time" is mostly neither
# arithmetic nor the weight read: it is fixed cost, Python and the launch of each of a few
# hundred operations. Horace He calls this regime **overhead-bound**, the third beside
# compute-bound and memory-bound:
#
# > "Overhead: everything else" — time spent neither computing FLOPs nor moving tensors
# > (Horace He, *Making Deep Learning Go Brrrr From First Principles*, 2022).
#
# In an overhead-bound step, more rows cost little: batching decodes makes each token
# cheaper. The cost per token stops falling once the arithmetic takes over, and a long
# prompt's attention grows as N², so the longest prefill can cost more per token than a
# shorter one. A GPU has a flat regime too, but there it is the weight read (and the KV
# read) that sets it, with a sharp edge to the compute-bound regime: the **roofline**, the
# model in which a step takes the larger of its compute time and its memory time (next
# section).

# %% [markdown]
# ## 4. The roofline of a real GPU (simulated)
#
# A GPU step takes at least `FLOPs / peak FLOP/s` (compute) and at least
# `bytes / bandwidth` (memory): the larger of the two sets it. The **ridge point**
# `peak / bandwidth` is the intensity where they meet. Below it a step is memory-bound,
# above it compute-bound. (Near the ridge a real GPU overlaps the two imperfectly, so the
# lab's cost model rounds the corner: it adds them as $(c^p + m^p)^{1/p}$, with `p`
# fitted to measurements; far from the ridge that is the larger of the two.)
#
# What share of the peak a step attains has two names: **MFU** (model FLOPs utilisation,
# the FLOPs the model needs over the time the step took, as a share of peak FLOP/s) for a
# compute-bound step, **MBU** (model bandwidth utilisation, bytes over time as a share of
# the memory bandwidth) for a memory-bound one.

# %%
import json
from pathlib import Path

from minilm.sim.costmodel import DEVICE_SPECS

h100 = DEVICE_SPECS["h100"]
cm = CostModel("llama-3-8b", "h100")
ridge = cm.flop_rate / cm.byte_rate  # the ridge with the model's efficiency factors
calibration = {c["name"]: c["value"] for c in json.loads(
    (Path(widgets.__file__).resolve().parents[1] / "bench" / "results" / "calibrate_gpu.json").read_text())["checks"]}
say(f"{h100.name}: **{h100.flops / 1e12:,.0f} TFLOP/s** dense bf16 and **{h100.mem_bw / 1e12:.2f} TB/s** "
    f"({h100.source}), a ridge point of **{h100.flops / h100.mem_bw:.0f} FLOP/byte**. An engine reaches part of "
    f"each: {h100.compute_efficiency:.0%} of the peak FLOP/s and {h100.memory_efficiency:.0%} of the bandwidth, "
    f"with the corner's p = {h100.roofline_p:.2f} and a fixed {h100.step_overhead * 1e3:.1f} ms a step, all fitted "
    f"to published measurements of A100 and H100 GPUs (`bench/calibrate_gpu.py`: on measurements left out of the "
    f"fit its median error is {calibration['held-out median |err| (fraction)']:.0%}; README, Benchmarks). That "
    f"moves the ridge to **{ridge:.0f} FLOP/byte**. Everything below is the cost model's prediction for "
    f"Llama-3-8B, not a measurement.")

# %%
# NBVAL_CHECK_OUTPUT
points = [("prefill", n, cm.cost([(n, n)])) for n in (16, 64, 256, 1024, 4096)]
points += [("decode", b, cm.cost([(1, 1024)] * b)) for b in (1, 8, 64, 256)]
print(f"ridge point with the model's efficiency factors: {ridge:.0f} FLOP/byte (simulated H100)")
for kind, n, c in points:
    roof_ms = max(c.compute_s, c.memory_s) * 1e3
    print(f"{kind:7s} {'N' if kind == 'prefill' else 'B'}={n:5d}: intensity {c.flops / c.bytes:7.1f} FLOP/byte, "
          f"{roof_ms:7.3f} ms, {c.bound}-bound")

# %% [markdown]
# ### Where does prefill turn compute-bound?
#
# A prefill of N tokens does about 2·N FLOPs for every weight it reads, a weight being b
# bytes: $2N/b$ FLOP/byte. It turns compute-bound where that reaches the ridge, at
# $N \approx \text{ridge} \cdot b / 2$. Ask the cost model for the first prompt length that
# is compute-bound, and compare:

# %%
# NBVAL_CHECK_OUTPUT
n_cross = next(n for n in range(1, 8192) if cm.cost([(n, n)]).bound == "compute")
estimate = ridge * cm.dtype_bytes / 2
# the output layer's weights are read every step but multiply only the last token of the prompt
with_head = estimate * cm.weight_bytes / (cm.dtype_bytes * cm.linear_params)
print(f"ridge * b / 2                                    = {estimate:6.1f} tokens")
print(f"... counting the output layer's weights as read  = {with_head:6.1f} tokens")
print(f"the cost model's first compute-bound prefill: N = {n_cross} tokens (simulated H100, Llama-3-8B)")

# %%
say(f"On an H100 a prefill must hold about **{n_cross} tokens** before its arithmetic, not its weight read, "
    f"sets its time. The simple estimate gives {estimate:.0f}; the output layer "
    f"({cm.lm_head_params / 1e9:.2f} B weights) is read every step yet multiplies only one token per "
    f"sequence, which moves the crossover to {with_head:.0f}. So the table above is no contradiction: "
    f"prompts of {', '.join(str(n) for k, n, c in points if k == 'prefill' and c.bound == 'memory')} "
    f"tokens are still memory-bound.")

# %% [markdown]
# > **Source 000, checked.** Prefill is "compute-bound, arithmetic intensity O(N)"
# > (Compute-bound, 算术强度 O(N)).
# >
# > The O(N) holds; "compute-bound" only above the crossover. Shorter prompts, and the
# > chunks of chunked prefill, are memory-bound as decode is; a chunk that rides with many
# > decodes can cross it together with them (section 5). With the source's own FLOP
# > formula, too small by section 2's factor, the crossover would come that many times later.

# %% [stored]
x = np.logspace(-0.5, 4, 100)
fig = go.Figure()
fig.add_scatter(x=x, y=np.minimum(cm.flop_rate, x * cm.byte_rate) / 1e12, name="roofline", line_color="gray")
for kind in ("prefill", "decode"):
    pts = [(c.flops / c.bytes, c.flops / max(c.compute_s, c.memory_s) / 1e12, n) for k, n, c in points if k == kind]
    fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], text=[str(p[2]) for p in pts],
                    mode="markers+text", textposition="top left", name=kind)
c = cm.cost([(n_cross, n_cross)])
fig.add_scatter(x=[c.flops / c.bytes], y=[c.flops / max(c.compute_s, c.memory_s) / 1e12], mode="markers+text",
                text=[f"crossover N={n_cross}"], textposition="bottom right", name="prefill crossover",
                marker=dict(symbol="x", size=12, color="black"))
# the ridge as a line trace: Plotly places shapes on a log axis in log10 units
fig.add_scatter(x=[ridge, ridge], y=[x.min() * cm.byte_rate / 1e12, cm.flop_rate / 1e12],
                mode="lines", line=dict(color="gray", dash="dot"), name=f"ridge ({ridge:.0f} FLOP/byte)")
fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="arithmetic intensity (FLOP/byte)",
                  yaxis_title="attained TFLOP/s", title="Llama-3-8B on an H100 (simulated)", height=420)
fig

# %% [markdown]
# ## 5. What the crossover means for a token budget (simulated)
#
# Chunked prefill (lesson 6) puts a prompt chunk into the same step as the running
# decodes. Take source `001`'s example of many requests decoding together, and add a chunk
# of k prompt tokens to their step: how much longer does the step take?

# %%
# NBVAL_CHECK_OUTPUT
decodes = [(1, 1024)] * 60  # 60 running requests with 1,024 tokens of context each
alone = cm.cost(decodes).time
k_cross = next(k for k in range(1, 8192) if cm.cost(decodes + [(k, k)]).bound == "compute")
chunk_sizes = list(range(0, 2049, 32))
step_ms = [cm.cost(decodes + [(k, k)] if k else decodes).time * 1e3 for k in chunk_sizes]
print(f"60 decodes alone: {alone * 1e3:.2f} ms a step; with a chunk of k prompt tokens (simulated H100):")
for k in (128, 256, k_cross, 512, 1024, 2048, 8192):  # 8,192: vLLM's default budget on an H100
    t = cm.cost(decodes + [(k, k)]).time
    print(f"  k = {k:4d}: {t * 1e3:6.2f} ms (+{t / alone - 1:5.1%}), {cm.cost(decodes + [(k, k)]).bound}-bound")

# %% [stored]
fig = go.Figure()
fig.add_scatter(x=chunk_sizes, y=step_ms, mode="lines", name="60 decodes + a chunk of k tokens")
fig.add_vline(x=k_cross, line_dash="dot", annotation_text=f"compute-bound from k = {k_cross}")
fig.update_layout(xaxis_title="prompt tokens in the step (k)", yaxis_title="step time (ms, simulated)",
                  title="Llama-3-8B on an H100 (simulated): the cost of a chunk riding with 60 decodes",
                  height=380)
fig

# %%
# NBVAL_CHECK_OUTPUT
with_chunk = {k: cm.cost(decodes + [(k, k)]).time for k in (256, k_cross, 512, 1024)}
riding = (with_chunk[256] - alone) / 256  # what each of 256 prompt tokens adds to the decodes' step
own_step = cm.cost([(256, 256)]).time / 256  # the same tokens in a step of their own
beyond = (with_chunk[1024] - with_chunk[512]) / 512
assert with_chunk[256] > 1.2 * alone and riding < 0.8 * own_step  # not free, but cheaper than alone
say(f"Simulated: prompt tokens do not ride along free. A chunk of 256 makes the 60 decodes' step "
    f"**{with_chunk[256] / alone - 1:.0%}** longer, and at the crossover ({k_cross} tokens, where the step turns "
    f"compute-bound) **{with_chunk[k_cross] / alone - 1:.0%}**: the cost model's rounded roofline corner charges "
    f"arithmetic well before the crossover (section 4). What riding along saves is the step's own weight read and fixed cost: each of "
    f"those 256 tokens adds **{riding * 1e6:.1f} us** to the decodes' step, against {own_step * 1e6:.1f} us in a "
    f"step of its own; past the crossover each adds {beyond * 1e6:.1f} us, its full compute.")

# %% [markdown]
# That is the shape of the budget sweep in lesson 6, section 4. A budget far below the
# crossover wastes steps: each one pays the full weight read for a handful of prompt
# tokens, so prompts take many steps and TTFT and throughput fall. Above it, every
# extra prompt token in a step costs its full compute, so the decodes' inter-token
# latency grows with the budget, while the step's weight read is shared by more tokens.
# No budget makes a chunk free for the decodes; the budget sets how much of each gap
# between their tokens a prompt may take. vLLM's default budget on an H100 is
# `max_num_batched_tokens=8192` for online serving (`16384` offline; `2048` and `8192`
# on smaller GPUs and the A100), far past this crossover: it favours the prompts' TTFT and throughput over the
# decodes' gaps (lesson 6 measures the trade).
#
# **What to remember.** Prefill does about 2 FLOPs per weight per token, so its
# intensity grows with the prompt: long prompts are compute-bound, short prompts and
# small chunks are memory-bound. Decode is memory-bound: a step of one sequence reads all
# of the weights to make one token, and the GPU's arithmetic sits idle. Batching many
# sequences' tokens into one step shares that weight read — the whole reason serving
# engines batch. The next lessons are about *how* to batch.
#
# **Exercise 1** (`exercises/01_prefill_decode.ipynb`): the roofline estimate, and the
# batch size at which decode stops being memory-bound, KV cache included (and whether it
# ever does).
