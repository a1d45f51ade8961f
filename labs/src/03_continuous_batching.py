# %% [markdown]
# # 3 · In-flight (continuous) batching
#
# Static batching (lesson 2) is a **group meal**: a table is served together, and the
# next group sits down only when the slowest eater has finished. Orca (Yu et al.,
# OSDI 2022) changed one thing: the batch is decided **at every step** (*iteration-level
# scheduling*), not once per batch. The picture is a **rotating sushi bar**: a guest
# sits down the moment a seat is free and leaves when full; nobody waits for the
# slowest eater. Every step the engine runs the same loop (source `000` calls it
# check → evict → fill):
#
# 1. **check** — which running requests ended in the last step (EOS or `max_tokens`)?
# 2. **evict** — they leave the batch at once and their KV memory is freed;
# 3. **fill** — requests waiting in the queue take the free seats;
# 4. **execute** — one model step over the batch: the prompts of the new arrivals and
#    one decode token for everybody else.
#
# In minilm, check and evict happen as a step ends (`Scheduler.update_from_output`
# retires a request the moment it samples its last token), fill when the next one is
# planned (the policy's `schedule`), and execute is the model call: the loop in
# `Engine.step`. vLLM, TensorRT-LLM ("in-flight batching"), SGLang and Hugging Face
# TGI all schedule per iteration this way. Whether a new prompt shares the model step
# with the decodes (*execute*, above) differs: Orca, TensorRT-LLM and vLLM V1 mix them in one step;
# vLLM V0 without chunked prefill, and by default SGLang and TGI, run a prefill as a
# forward pass of its own while the decodes wait (lesson 6 compares the two).

# %% [markdown]
# ## 1. The loop, one step at a time
#
# Six requests, at most `max_num_seqs=3` running at once. We call `engine.step()`
# ourselves and print, for each step, who filled a free seat, what the step executed,
# and who was evicted when it ended.

# %%
# NBVAL_CHECK_OUTPUT
from minilm import Engine, EngineConfig, make_workload, run_workload, steps_df, summarize
from labs.prose import check, say
import widgets

engine = Engine("tiny", EngineConfig(policy="continuous", max_num_seqs=3))
for i, n_out in enumerate([2, 5, 3, 4, 2, 3]):
    engine.add_request(f"r{i}", prompt_ids=[1] * (4 + 2 * i), max_tokens=n_out, ignore_eos=True)
while engine.has_unfinished():
    s = engine.step()
    filled = [i.request_id for i in s.items if i.kind == "prefill"]
    evicted = [r.request_id for r in engine.timeline.requests if r.t_finished == s.t_end]
    ran = "  ".join(f"{i.request_id}:{i.kind} {i.num_tokens}" for i in s.items)
    print(f"step {s.step}: fill {' '.join(filled) or '-':8s} | execute {ran:58s} | evict {' '.join(evicted) or '-'}")

# %%
# NBVAL_CHECK_OUTPUT
# The story of r0 and r3, read back from the timeline (not typed in)
first_step = {}
for s in engine.timeline.steps:
    for i in s.items:
        first_step.setdefault(i.request_id, s.step)
done_step = {r.request_id: next(s.step for s in engine.timeline.steps if s.t_end == r.t_finished)
             for r in engine.timeline.requests}
partners = [i.request_id for i in engine.timeline.steps[first_step["r3"]].items if i.kind == "decode"]
say(f"Follow `r0`: its prompt runs in step {first_step['r0']} together with those of `r1` and `r2`, and "
    f"that step samples its first token; its last token comes in step {done_step['r0']}, and it is evicted "
    f"as that step ends. In step {first_step['r3']}, `r3` **fills** its seat: `r3`'s prompt runs in the same "
    f"step as the decodes of {' and '.join(f'`{p}`' for p in partners)}.")

# %% [markdown]
# A step can mix prefill and decode work. Orca calls this *selective batching*: the
# token-wise parts of the model (projections, MLP) run on all the step's tokens as one
# matrix; only attention is done per sequence (lesson 5 shows how one kernel does it).
# The Gantt chart is source `000`'s second drawing, from a real run: where one request
# ends, the next one starts in the following step.

# %%
widgets.gantt_figure(engine.timeline)

# %% [markdown]
# ## 2. Effective batch size over time
#
# The **effective batch size** B_eff is how many requests do real work in a step.
# Static batching lets it sag as rows finish, while the finished rows are still
# computed (as padding); in-flight batching refills it at once. The same `mixed`
# workload for both policies, `max_num_seqs=8`, with eight requests per seat: once the
# queue is empty, in-flight batching too runs a batch that thins out as its last
# requests finish, and that tail is not the policy's pace (section 4 comes back to it).
# So B_eff is counted twice: while requests wait, and over the whole run.

# %%
# NBVAL_CHECK_OUTPUT
specs = make_workload("mixed", num_requests=64, seed=0, max_model_len=512)
knobs = dict(max_num_seqs=8, max_model_len=512, sampling={"ignore_eos": True})
tls = {p: run_workload(specs, policy=p, **knobs) for p in ("static", "continuous")}


def rows_computed(step):
    """Rows the model computed in a step: real work and padding rows alike."""
    return len({i.request_id for i in step.items if i.kind != "cached"})


def real_rows(step):
    return len({i.request_id for i in step.items if i.kind in ("prefill", "decode")})


for p, t in tls.items():
    m = summarize(t)
    queued = [s for s in t.steps if s.num_waiting > 0]
    rows = sum(rows_computed(s) for s in t.steps) / len(t.steps)
    print(f"{p:10s}: {len(specs)} requests in {m['steps']} steps ({len(queued)} of them with requests waiting); "
          f"B_eff {sum(map(real_rows, queued)) / len(queued):.2f} while they wait, {m['mean_batch_size']:.2f} over "
          f"the run; rows computed per step {rows:.2f}, padding {m['padding_fraction']:.0%} of computed tokens")

# %%
import plotly.graph_objects as go

fig = go.Figure()
for p, t in tls.items():
    df = steps_df(t)
    fig.add_scatter(x=df.step, y=df.batch_size, name=f"{p}: B_eff (real work)", mode="lines", line_shape="hv")
fig.add_scatter(x=list(range(len(tls["static"].steps))), y=[rows_computed(s) for s in tls["static"].steps],
                name="static: rows computed (real + padding)", mode="lines", line_shape="hv",
                line=dict(dash="dot", color="gray"))
fig.update_layout(xaxis_title="step", yaxis_title="requests", height=350,
                  title="static batching computes every row, real or not; in-flight batching refills them")
fig

# %% [markdown]
# ## 3. Throughput ≈ B_eff × steps per second
#
# Source `000` sums the idea up in one formula: output tokens per second ≈ B_eff × SPS,
# where SPS is steps per second. Under static batching B_eff decays as requests finish;
# under in-flight batching it stays near `max_num_seqs` while the queue is not empty.
# Both sides, from the measured timelines, over the whole run (and a third run, with
# chunked prefill, lesson 6: a prompt computed over several steps, at most `16` tokens a
# step):

# %%
tls["chunked"] = run_workload(specs, policy="chunked", max_num_batched_tokens=16, **knobs)
for p, t in tls.items():
    m = summarize(t)
    steps_per_s = m["steps"] / m["wall_s"]
    print(f"{p:10s}: B_eff {m['mean_batch_size']:.2f} x {steps_per_s:4.0f} steps/s = "
          f"{m['mean_batch_size'] * steps_per_s:4.0f}; measured {m['output_tok_per_s']:4.0f} output tokens/s")

# %% [markdown]
# For static and continuous batching the two sides agree exactly — but that confirms
# nothing. In this engine every row doing real work samples exactly one token (a decode
# samples one; a step that completes a prompt samples its first), so B_eff summed over
# the steps *is* the number of output tokens, and the formula is an identity.
#
# Chunked prefill breaks it. A chunk that does not finish its prompt is real work that
# samples nothing, so B_eff × SPS overstates the throughput. The size of the gap is pure
# step structure (the time cancels out), the same on every machine:

# %%
# NBVAL_CHECK_OUTPUT
t = tls["chunked"]
real_rows = sum(len({i.request_id for i in s.items if i.kind in ("prefill", "decode")}) for s in t.steps)
sampled = summarize(t)["output_tokens"]  # one token per sampling row
say(f"Under chunked prefill the steps did **{real_rows}** rows of real work but sampled **{sampled}** tokens: "
    f"**{real_rows - sampled}** rows were prompt chunks that did not end their prompt. B_eff × SPS overstates "
    f"the throughput by **{real_rows / sampled - 1:.0%}**; the right first factor is *tokens sampled per step*, "
    f"not rows.")

# %% [markdown]
# **Does in-flight batching pay for its fuller steps in the second factor?** One might
# expect so: more requests in a step, a slower step. But static batching computes all
# its rows every step — the finished ones as padding, and its prompts padded to the
# longest — so its steps are no lighter, and in-flight batching should lose no steps per
# second against it. Measured CPU times vary too much from run to
# run to settle such a question; the simulated clock settles it for Llama-3-8B on an
# H100, with every request queued at once:

# %%
# NBVAL_CHECK_OUTPUT
from minilm.sim import simulated_engine

offline = make_workload("mixed", num_requests=200, seed=0, vocab_size=128256)
saturated = {}
for p in ("static", "continuous"):
    engine = simulated_engine("llama-3-8b", "h100", policy=p, max_num_seqs=64, record_kv_blocks=False)
    engine.add_workload(offline)
    saturated[p] = engine.run()
print(f"{len(offline)} mixed requests, all queued at t=0, up to {engine.config.max_num_seqs} running")
for p, t in saturated.items():
    m = summarize(t)
    rows = sum(rows_computed(s) for s in t.steps) / len(t.steps)
    print(f"{p:10s}: rows computed per step {rows:5.1f}, B_eff {m['mean_batch_size']:5.1f}, "
          f"{m['steps'] / m['wall_s']:5.1f} steps/s, {m['output_tok_per_s']:6.0f} output tok/s (simulated)")

# %%
# NBVAL_CHECK_OUTPUT
ms = {p: summarize(t) for p, t in saturated.items()}
sps = {p: m["steps"] / m["wall_s"] for p, m in ms.items()}
rows = {p: sum(rows_computed(s) for s in t.steps) / len(t.steps) for p, t in saturated.items()}
sps_gain = sps["continuous"] / sps["static"]
beff_gain = ms["continuous"]["mean_batch_size"] / ms["static"]["mean_batch_size"]
assert sps_gain > 1 and beff_gain > 2 * sps_gain  # "a gain, even" and "most of it" below
say(f"On the simulated H100, static batching manages **{sps['static']:.0f}** steps/s and in-flight batching "
    f"**{sps['continuous']:.0f}**: no loss in the second factor, a gain even, because its steps compute fewer "
    f"rows ({rows['continuous']:.1f} against {rows['static']:.1f}: no padding). Throughput "
    f"×{ms['continuous']['output_tok_per_s'] / ms['static']['output_tok_per_s']:.1f} = steps/s ×{sps_gain:.2f} "
    f"times B_eff ×{beff_gain:.2f} ({ms['static']['mean_batch_size']:.1f} → "
    f"{ms['continuous']['mean_batch_size']:.1f}): most of the gain is in B_eff.")

# %% [markdown]
# The sources also say what the GPU does meanwhile. Each step of the saturated in-flight
# run above, priced by the cost model:

# %%
# NBVAL_CHECK_OUTPUT
from minilm.sim.costmodel import CostModel, items_shape

h100 = CostModel("llama-3-8b", "h100")
costs = [h100.cost(items_shape(s.items)) for s in saturated["continuous"].steps]
memory_bound = sum(c.bound == "memory" for c in costs)
mfu = sum(c.flops for c in costs) / (ms["continuous"]["wall_s"] * h100.device.flops)
assert memory_bound > len(costs) / 2 and mfu < 0.5  # the verdict below
say(check("000 and 001", "In-flight batching lets the compute \"never sit idle\" (永远不闲着), \"effective GPU "
          "utilisation nearly constant\" (有效 GPU 利用率近乎恒定); the memory and compute units are \"always "
          "under high load\" (始终处于高负载).",
          f"**{memory_bound}** of the run's **{len(costs)}** steps are memory-bound, and over the run the model "
          f"uses **{mfu:.0%}** of the H100's peak FLOP/s. In-flight batching keeps the batch's *seats* full, not "
          f"the arithmetic units: a decode step stays bound by reading weights and KV (lesson 1), and what "
          f"batching buys is more tokens for each read. True of the seats and of the memory, not of the compute."))

# %% [markdown]
# ## 4. The on/off experiment
#
# The same workload with in-flight batching off (`static`) and on (`continuous`), shown
# on a shared time axis: where does each run finish?

# %%
widgets.compare_figure({p: tls[p] for p in ("static", "continuous")})

# %%
ratio = summarize(tls["continuous"])["output_tok_per_s"] / summarize(tls["static"])["output_tok_per_s"]
say(f"Measured on this machine (it varies from run to run): continuous batching gives **{ratio:.1f}x** the "
    f"output tokens/s of static batching.")

# %% [markdown]
# And on a GPU, under load: requests arriving over time (a Poisson process) instead of
# all at once (simulated, Llama-3-8B on an H100):

# %%
# NBVAL_CHECK_OUTPUT
n, rate, seqs = 200, 50.0, 64
online = make_workload("mixed", num_requests=n, seed=0, rate=rate, vocab_size=128256)
sim = {}
for p in ("static", "continuous"):
    engine = simulated_engine("llama-3-8b", "h100", policy=p, max_num_seqs=seqs, record_kv_blocks=False)
    engine.add_workload(online)
    sim[p] = summarize(engine.run())
print(f"{n} mixed requests arriving at {rate:.0f}/s, up to {seqs} running")
for p, m in sim.items():
    print(f"{p:10s}: {m['output_tok_per_s']:7.0f} output tok/s, TTFT p50 {m['ttft_p50'] * 1e3:7.1f} ms, "
          f"e2e p50 {m['e2e_p50']:6.2f} s (simulated)")

# %% [markdown]
# Under load, in-flight batching does not only raise throughput: a request no longer
# waits for a whole batch to finish before it starts, so its time to first token and
# its end-to-end latency fall too.
#
# **How big is the gain?** Both sources give a range of speed-ups (quoted in the callout
# below and in lesson 2), and source `000` names what it depends on: how much the lengths
# of the workload vary. The lab can check that dependence. Below, one set of requests with equal
# prompts is given output lengths from one log-normal family, from all equal to very
# uneven (the mean stays the same); each version runs with static and with in-flight
# batching, all queued at once, on the simulated H100:

# %%
# NBVAL_CHECK_OUTPUT
import numpy as np
from minilm import RequestSpec

rng = np.random.default_rng(0)
z = rng.standard_normal(128)                                # one draw per request, scaled by sigma below
prompts = [rng.integers(0, 128256, 128).tolist() for _ in z]
mean_out, seqs = 128, 32
print(f"{len(z)} requests, {len(prompts[0])}-token prompts, mean output {mean_out} tokens, up to {seqs} running")
spread = {}
for sigma in (0.0, 0.5, 1.0, 1.5):
    # log-normal lengths; the -sigma²/2 keeps their mean at mean_out whatever the spread
    outputs = np.maximum(1, np.round(mean_out * np.exp(sigma * z - sigma ** 2 / 2))).astype(int)
    reqs = [RequestSpec(f"r{i}", p, int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]
    tok_s = {}
    for p in ("static", "continuous"):
        engine = simulated_engine("llama-3-8b", "h100", policy=p, max_num_seqs=seqs, record_kv_blocks=False)
        engine.add_workload(reqs)
        tok_s[p] = summarize(engine.run())["output_tok_per_s"]
    cv = outputs.std() / outputs.mean()  # coefficient of variation: how uneven the lengths are
    spread[cv] = tok_s["continuous"] / tok_s["static"]
    print(f"output lengths {outputs.min():4d}-{outputs.max():4d} (CV {cv:4.2f}): continuous / static "
          f"throughput {spread[cv]:.2f}x (simulated)")

# %% [stored]
fig = go.Figure(go.Scatter(x=list(spread), y=list(spread.values()), mode="lines+markers"))
fig.add_hrect(y0=2, y1=8, fillcolor="orange", opacity=0.12, line_width=0,
              annotation_text="source 000: 2–8x", annotation_position="top left")
fig.update_layout(xaxis_title="how uneven the output lengths are (coefficient of variation)",
                  yaxis_title="continuous / static output tok/s", yaxis_range=[0, 8.5], height=350,
                  title="the gain grows with length variance (Llama-3-8B, H100, simulated, all queued at t=0)")
fig

# %%
# NBVAL_CHECK_OUTPUT
cvs = list(spread)
assert list(spread.values()) == sorted(spread.values())  # "grows with the spread"
say(check("000", "Throughput rises \"several times … generally 2–8x, depending on how much the lengths of the "
          "workload vary\" (具体取决于工作负载长度方差，幅度一般在 2–8× 区间).",
          f"With equal lengths there is nothing to gain (**{spread[cvs[0]]:.2f}x**); the gain grows with the "
          f"spread, to **{spread[cvs[-1]]:.2f}x** at a coefficient of variation of {cvs[-1]:.1f}. The dependence "
          f"is real; the range is a rule of thumb that also folds in arrival patterns, queueing and memory "
          f"(lesson 4), none of which this offline, compute-only sweep has."))

# %% [markdown]
# One more factor hides in any such number: how long the queue is. Once the queue is
# empty, in-flight batching too runs a batch that thins out as its last requests finish,
# and a short run is mostly that tail. The most uneven case again, with four times the
# requests per seat:

# %%
# NBVAL_CHECK_OUTPUT
def speedup_at(num_requests, sigma):
    """continuous / static output tok/s for `num_requests` of this section's requests (fresh draws)."""
    draw = np.random.default_rng(1)
    outputs = np.maximum(1, np.round(mean_out * np.exp(sigma * draw.standard_normal(num_requests) - sigma ** 2 / 2)))
    reqs = [RequestSpec(f"r{i}", prompts[i % len(prompts)], int(o)) for i, o in enumerate(outputs)]
    tok_s = {}
    for p in ("static", "continuous"):
        engine = simulated_engine("llama-3-8b", "h100", policy=p, max_num_seqs=seqs, record_kv_blocks=False)
        engine.add_workload(reqs)
        tok_s[p] = summarize(engine.run())["output_tok_per_s"]
    return tok_s["continuous"] / tok_s["static"]

short, long_run = speedup_at(len(z), 1.5), speedup_at(4 * len(z), 1.5)
print(f"{len(z)} requests: {short:.2f}x; {4 * len(z)} requests: {long_run:.2f}x (simulated)")

# %%
# NBVAL_CHECK_OUTPUT
assert long_run > short  # what the sentence says
say(f"{len(z) // seqs} requests per seat: **{short:.2f}x**; {4 * len(z) // seqs} per seat: **{long_run:.2f}x**. "
    f"Lesson 2's sweep queued more requests per seat than this one and found larger gains for that reason: "
    f"compare speed-ups only at equal run lengths, and prefer long ones.")

# %% [markdown]
# ## 5. A request's life: the state machine
#
# Source `000` draws a request's life as a state machine: **waiting** → (a free slot and
# it can be scheduled) → **prefill** → **decode** (one token per step, again and again) →
# (EOS or the maximum length) → **completed**. The engine's own states
# (`minilm/request.py`) are coarser: `pending` (not yet arrived), `waiting`, `running`,
# `finished`. Prefill and decode are not states there: a running request simply has
# tokens left to compute, its whole prompt or one token (vLLM V1 sees it the same way).
#
# The engine also has an edge the drawing lacks: **preemption**. In-flight batching admits
# requests without knowing how long they will grow; each new token needs room for its keys
# and values in the KV cache (lesson 4). When a step needs room and none is left, the
# engine takes a running request's KV memory away (the newest one, as vLLM does) and puts
# it back at the head of the queue; when it is admitted again it recomputes its prompt and
# its output so far. Exercise 3's scheduler does the same.
#
# Every transition can be read off a timeline. A real run, with real text: the
# `docstrings` model (lesson 0), whose outputs end at its EOS token or at `max_tokens`
# (here `48`), in-flight batching, and a KV cache too small for everyone:

# %%
docs = make_workload("docstrings", num_requests=12, seed=1, max_model_len=256)
for d in docs:
    d.max_tokens = 48
life = Engine("docstrings", EngineConfig(policy="continuous", max_num_seqs=4, num_blocks=8))
life.add_workload(docs)
life_tl = life.run()
widgets.states_figure(life_tl)

# %%
counts = widgets.transition_counts(life_tl)
reasons = {k: sum(r.finish_reason == k for r in life_tl.requests) for k in ("stop", "length")}
preempted = counts["prefill", "waiting"] + counts["decode", "waiting"]
assert preempted == summarize(life_tl)["preemptions"] > 0 and counts["prefill", "prefill"] == 0
say(f"Of the {len(life_tl.requests)} requests, {reasons['stop']} ended at EOS and {reasons['length']} at "
    f"`max_tokens`. The {counts['waiting', 'prefill']} admissions are more than the requests: **{preempted}** "
    f"preemptions sent requests back to the queue, each to be admitted again and to recompute its prompt and its "
    f"output so far.")

# %% [markdown]
# The drawing has one more edge, "chunk not finished → back to prefill": a long prompt
# computed a piece at a time over several steps. That is *chunked prefill*, lesson 6,
# which draws this machine again with that edge in use.

# %% [markdown]
# **What to remember.** Scheduling per iteration keeps the batch full and lets a new
# request start at the next step. Throughput is tokens sampled per step times steps per
# second; static batching computes its padding, so in-flight batching wins on the
# first factor and loses nothing on the second. How much it wins depends on how uneven
# the lengths are and on how loaded the server is.
#
# > Orca reports 36.9x the throughput of NVIDIA FasterTransformer at the same latency,
# > for GPT-3 175B (Yu et al., OSDI 2022; their setting, not measured here).
#
# **Exercise 3** (`exercises/03_continuous_batching.ipynb`): write this policy yourself,
# as a `Policy` class with a `schedule` method, keeping a watermark of free KV blocks
# (vLLM V0's), checked step by step against the engine's, preemptions included.
