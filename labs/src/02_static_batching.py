# %% [markdown]
# # 2 · Static batching
#
# The simplest way to batch: collect up to `max_num_seqs` requests, pad their prompts to
# the longest one, and run the batch until **every** row has finished. Then start the
# next batch. It is how `model.generate(batch)` works in most libraries.
#
# Source `001` starts where serving started: classic deep-learning inference (image
# classification, BERT) had requests of fixed shape, an input of known size and one
# output, so a batch of them was a dense tensor that kept the GPU busy, and static
# batching was all anyone needed. An LLM breaks both halves: a prompt can be a few words
# or tens of thousands of tokens, and nobody knows how long the answer will be until the
# model writes its end-of-text token.
#
# Source `000` pictures it as a **group meal**: the table is served together, and the next
# group sits down only when everyone at the table has finished; source `001` calls it
# the short stave of a barrel: the batch is as slow as its slowest request. Two kinds of
# waste follow:
#
# * **padding** — short prompts are padded to the longest, and a row that has finished
#   still occupies its place in every step until the longest row ends (a *bubble*);
# * **queueing** — a request that arrives while a batch runs waits for the whole batch.
#
# This lesson measures both, on the lab's own model with lengths set by its end-of-text
# token, and on a simulated GPU, and checks the sources' numbers for what in-flight
# batching (lesson 3) gains over it.

# %% [markdown]
# ## 1. One static batch, step by step
#
# A handful of requests with different prompt and output lengths, in one batch: source
# `000`'s picture of requests A, B and C, run for real. (`ignore_eos` makes each request
# generate exactly `max_tokens` tokens.)

# %%
# NBVAL_CHECK_OUTPUT
from minilm import RequestSpec, items_df, make_workload, run_workload, steps_df, summarize
from labs.prose import check, say
import widgets

specs = [RequestSpec("r0", [1] * 24, max_tokens=6), RequestSpec("r1", [1] * 8, max_tokens=2),
         RequestSpec("r2", [1] * 16, max_tokens=4), RequestSpec("r3", [1] * 4, max_tokens=3)]
tl = run_workload(specs, policy="static", max_num_seqs=len(specs), sampling={"ignore_eos": True})
for s in tl.steps:
    print(f"step {s.step}: " + "  ".join(f"{i.request_id}:{i.kind[:3]}{i.num_tokens}" for i in s.items))

# %%
first = {i.request_id: i for i in tl.steps[0].items if i.kind == "prefill"}
pads = {i.request_id: i.num_tokens for i in tl.steps[0].items if i.kind == "padding"}
r1, longest = "r1", max(s.max_tokens for s in specs)
r1_len = next(s.max_tokens for s in specs if s.id == r1)
say(f"`pre` is prefill, `dec` decode, `pad` padding. Step 0 computes r1's **{first[r1].num_tokens}** prompt "
    f"tokens *plus* **{pads[r1]}** padding tokens, so that every row is {first[r1].num_tokens + pads[r1]} long. "
    f"r1 has its {r1_len} tokens after step {r1_len - 1} (its first came out of the prefill), yet it computes "
    f"a padding token in every step until the slowest eater, r0, has its {longest}. The Gantt chart shows the "
    f"bubbles:")

# %%
widgets.gantt_figure(tl)

# %% [markdown]
# ## 2. How much is wasted?
#
# Count the padding tokens the batch computed, split into prompt padding (step 0) and
# the bubbles of finished rows (later steps).

# %%
# NBVAL_CHECK_OUTPUT
items = items_df(tl)
pad = items[items.kind == "padding"]
prompt_pad = int(pad[pad.step == 0].num_tokens.sum())
bubble_pad = int(pad[pad.step > 0].num_tokens.sum())
computed = int(items.num_tokens.sum())
print(f"computed {computed} tokens: {prompt_pad} prompt padding + {bubble_pad} bubble padding "
      f"= {(prompt_pad + bubble_pad) / computed:.0%} wasted (summarize: {summarize(tl)['padding_fraction']:.0%})")

# %% [markdown]
# On a bigger workload the waste depends on how uneven the lengths are. The `mixed`
# preset draws its lengths from a **log-normal** distribution: the logarithm of a length
# is normally distributed, so most lengths sit near the median and a few are many times
# longer (a heavy tail, the shape of real chat traffic such as ShareGPT's); `uniform`
# draws them evenly over a range.

# %%
# NBVAL_CHECK_OUTPUT
for preset in ("uniform", "mixed"):
    workload = make_workload(preset, num_requests=16, seed=0, max_model_len=512)
    m = summarize(run_workload(workload, policy="static", max_num_seqs=8, max_model_len=512,
                               sampling={"ignore_eos": True}))
    outs = [s.max_tokens for s in workload]
    print(f"{preset:8s}: output lengths {min(outs)}-{max(outs)}; {m['steps']} steps, padding "
          f"{m['padding_fraction']:.0%} of computed tokens, mean real rows per step {m['mean_batch_size']:.2f} of 8")

# %% [markdown]
# Padding is not free: static batching really computes it (the engine runs padded rows
# like real ones), so on this machine it costs time.

# %%
def summed_step_ms(policy):
    """Section 1's batch under a policy: the time of its steps, summed, and how many there were."""
    t = run_workload(specs, policy=policy, max_num_seqs=len(specs), sampling={"ignore_eos": True})
    return sum(s.duration for s in t.steps) * 1e3, len(t.steps)


times = {"static": [], "continuous": []}  # continuous (lesson 3): the same rows, without padding
for _ in range(9):  # interleaved, so a busy moment of the machine hits both; the first round warms up
    for policy in times:
        times[policy].append(summed_step_ms(policy))
(padded_ms, padded_steps), (unpadded_ms, unpadded_steps) = (min(times[p][1:]) for p in times)
assert padded_steps == unpadded_steps
say(f"Section 1's batch without its padding (in-flight batching, lesson 3: the same {padded_steps} steps with "
    f"only the real rows) took **{unpadded_ms:.1f} ms** of steps against **{padded_ms:.1f} ms** padded (fastest "
    f"of {len(times['static']) - 1} interleaved runs each), so "
    f"padding cost about **{1 - unpadded_ms / padded_ms:.0%}** of the time here (measured on this CPU), though "
    f"it was {summarize(tl)['padding_fraction']:.0%} of the tokens: most of a small CPU step is fixed cost "
    f"(lesson 1), which extra rows do not add to.")

# %% [markdown]
# On a GPU the same padding costs much less time, and the reason is lesson 1: a decode
# step is memory-bound, so a padded row's arithmetic hides under the weight read the
# real rows pay anyway. Take a static run of the `mixed` preset on Llama-3-8B on an H100
# (simulated) and ask the cost model what each step would take without its padding:

# %%
# NBVAL_CHECK_OUTPUT
from minilm.sim.costmodel import CostModel
from minilm.sim import simulated_engine

cm = CostModel("llama-3-8b", "h100")
engine = simulated_engine("llama-3-8b", "h100", policy="static", max_num_seqs=16)
engine.add_workload(make_workload("mixed", num_requests=64, seed=0, vocab_size=engine.model_config.vocab_size))
gpu = engine.run()
with_padding = sum(s.duration for s in gpu.steps)
without = sum(cm.items_time([i for i in s.items if i.kind != "padding"]) for s in gpu.steps)
prefill_steps = [s for s in gpu.steps if any(i.kind == "prefill" for i in s.items)]
pre_with = sum(s.duration for s in prefill_steps)
pre_without = sum(cm.items_time([i for i in s.items if i.kind != "padding"]) for s in prefill_steps)
print(f"padding: {summarize(gpu)['padding_fraction']:.0%} of the computed tokens, "
      f"{1 - without / with_padding:.1%} of the time (simulated)")
print(f"  of which the padded prefill steps: {pre_with * 1e3:.0f} ms with padding, {pre_without * 1e3:.0f} ms without")

# %% [markdown]
# > **Source 001, checked.** The GPU wastes "a great deal of floating-point compute on
# > [PAD] placeholders" (GPU 把大量浮点算力浪费在了计算[PAD]占位符上).
# >
# > In FLOPs, yes; in time, mostly no (the table above): only the padded *prompts* cost
# > real time (a long prefill is compute-bound), while padded decode rows ride along almost
# > free. What a GPU loses to static batching is the *places*: a finished row holds a seat
# > that a waiting request could use, and every step reads all the weights for fewer real
# > tokens. The next section measures that.

# %% [markdown]
# ## 3. Realistic lengths: where the speed-up of in-flight batching comes from
#
# Every run so far used `ignore_eos`, so output lengths were whatever the workload said.
# Real outputs end where the model writes its end-of-text token, and nobody knows in
# advance where. The lab's `docstrings` model does that: the `docstrings` workload gives
# it the first words of held-out docstrings and a generous `max_tokens`, and each
# request ends at the model's own EOS. Serve the same requests with static and with
# in-flight batching (`continuous`, lesson 3), measured on this machine:

# %%
from minilm import Engine
import numpy as np

docs = make_workload("docstrings", num_requests=24, seed=0)
measured = {}
for policy in ("static", "continuous"):
    engine = Engine("docstrings", policy=policy, max_num_seqs=8)
    engine.add_workload(docs)  # no ignore_eos: each request stops at the model's EOS
    measured[policy] = engine.run()
# the timeline lists requests as they finish; put them back in arrival (workload) order
done = {r.request_id: r for r in measured["continuous"].requests}
doc_records = [done[spec.id] for spec in docs]
doc_lens = np.array([r.output_len for r in doc_records])
doc_cv = doc_lens.std() / doc_lens.mean()
stopped = sum(r.finish_reason == "stop" for r in doc_records)
tput = {p: summarize(t)["output_tok_per_s"] for p, t in measured.items()}


def empty_kv_share(tl):
    """Share of the KV slots held over the run that held no token (reserved, not yet or never written)."""
    df = steps_df(tl)
    return 1 - df.kv_tokens_stored.sum() / (df.kv_blocks_used * tl.meta["block_size"]).sum()


print("policy      output tok/s  KV slots held but empty (measured here)")
for policy, t in measured.items():
    print(f"{policy:10s} {tput[policy]:13.0f} {empty_kv_share(t):25.0%}")

# %%
say(f"Output lengths from {doc_lens.min()} to {doc_lens.max()} tokens (median {np.median(doc_lens):.0f}, "
    f"coefficient of variation {doc_cv:.2f}); {stopped} of {len(doc_lens)} requests stopped at EOS, the others "
    f"at `max_tokens`. Static batching: **{tput['static']:.0f}** output tokens/s; in-flight: "
    f"**{tput['continuous']:.0f}**, **{tput['continuous'] / tput['static']:.1f}x** (measured here). Static batching "
    f"also reserved KV for every row's padded length (the batch's longest prompt plus its largest `max_tokens`), "
    f"because it cannot know where EOS will come: "
    f"**{empty_kv_share(measured['static']):.0%}** of the KV slots it held stayed empty, against "
    f"{empty_kv_share(measured['continuous']):.0%} for the paged cache of in-flight batching.")

# %%
block = measured["continuous"].meta["block_size"]
assert empty_kv_share(measured["continuous"]) >= 0.04  # "not under 4%" below
say(check("000", "Paging cuts KV waste \"from the traditional schemes' 60–80% to close to 0\" (内存浪费率从传统方案的 "
          "60–80% 降至接近 0), citing vLLM, whose blog (2023-06-20) says under 4%, only in a sequence's last block.",
          f"Here the paged cache's empty slots are only the unfilled end of each running sequence's last block of "
          f"{block}; with outputs this short (median {np.median(doc_lens):.0f} tokens) that end is a larger share "
          f"than for long chat sequences: **{empty_kv_share(measured['continuous']):.0%}**, not under 4%. "
          f"Lesson 4 measures the traditional scheme's share on the same memory."))

# %% [markdown]
# Why is in-flight batching faster? Source `000` writes throughput as $B_\text{eff} \times \text{SPS}$ (real rows per
# step times steps per second) and says that under static batching $B_\text{eff}$ decays
# as requests finish, while in-flight batching keeps it near the maximum. Here are both
# runs' real rows per step:

# %%
import plotly.graph_objects as go

fig = go.Figure()
for policy, t in measured.items():
    df = steps_df(t)
    fig.add_scatter(x=df.t_start, y=df.batch_size, mode="lines", line_shape="hv", name=policy)
fig.update_layout(xaxis_title="time (s, measured on this machine)", yaxis_title="requests with real work in the step",
                  title="docstrings model, lengths from EOS: the effective batch size", height=340)
fig

# %% [markdown]
# The sawtooth is static batching: each batch starts full and thins out as its rows hit
# EOS, while the one long row holds the table. In-flight batching refills a place as soon
# as it frees up.
#
# The speed-up is not a constant. What do the sources say?
#
# > Source `001`: continuous batching "raises the concurrent throughput of an inference
# > service 2–4x" (将推理服务的并发吞吐提升了2 ~ 4 倍).
#
# > Source `000`: throughput improves "several-fold, depending on the variance of the
# > workload's lengths, generally in the 2–8x range" (业界实测经验值，未统一口径: industry
# > experience, no common benchmark).
#
# > vLLM (Kwon et al., SOSP 2023) reports 2–4x the throughput of FasterTransformer and Orca
# > at the same latency; Orca (Yu et al., OSDI 2022) 36.9x over FasterTransformer for
# > GPT-3 175B at the same latency.
#
# Orca's is the in-flight-batching number. vLLM's is not: Orca already schedules per
# iteration, so vLLM's gain over it comes from PagedAttention's memory management
# (lesson 4), which fits more sequences in the batch. (Source `001` credits continuous
# batching to "Orca 论文与 vLLM" — the Orca paper and vLLM; it is Orca's idea, and vLLM
# built on it.)
#
# Test the claim the lab can test: how the speed-up moves with the spread of output
# lengths. Llama-3-8B on an H100, **simulated**: all requests waiting at the start, equal
# prompts, output lengths drawn from a log-normal with the same mean and a growing
# spread (measured by the *coefficient of variation*, the standard deviation over the
# mean), for two batch sizes. The lengths are random draws, so each case runs over five
# seeds: the table gives the median and the range, the figure the range as error bars.

# %%
# NBVAL_CHECK_OUTPUT
import pandas as pd


def spread_lengths(cv, n, mean=64, seed=0):
    """n output lengths with the given mean and coefficient of variation (log-normal; cv 0: all equal)."""
    sigma = np.sqrt(np.log1p(cv ** 2))
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, n)), 1, 1536).astype(int)


def speedup(outputs, batch, prompts=None):
    """Output tokens/s of in-flight over static batching, simulated, everything waiting at t = 0."""
    prompts = prompts if prompts is not None else [128] * len(outputs)
    work = [RequestSpec(f"r{i}", [7] * int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]
    rate = {}
    for policy in ("static", "continuous"):
        engine = simulated_engine("llama-3-8b", "h100", policy=policy, max_num_seqs=batch)
        engine.add_workload(work)
        rate[policy] = summarize(engine.run())["output_tok_per_s"]
    return rate["continuous"] / rate["static"]


SEEDS = range(5)
rows = []
for batch in (8, 32):
    for cv in (0.0, 0.25, 0.5, 1.0, 1.5):
        gains = [speedup(spread_lengths(cv, 16 * batch, seed=seed), batch) for seed in SEEDS]
        rows.append({"max_num_seqs": batch, "cv": cv, "speedup": float(np.median(gains)), "min": min(gains),
                     "max": max(gains)})
sweep = pd.DataFrame(rows)
print(f"output-length spread (cv) -> in-flight / static output tokens/s, Llama-3-8B on an H100 (simulated, "
      f"{len(SEEDS)} seeds)")
print(sweep.rename(columns={"cv": "cv (drawn from)", "speedup": "median (x)", "min": "min (x)", "max": "max (x)"})
      .round(2).to_string(index=False))

# %%
# the same requests, in the same order, with the lengths the docstrings model gave them
replayed = speedup(doc_lens, 8, prompts=[r.prompt_len for r in doc_records])
fig = go.Figure()
fig.add_hrect(y0=2, y1=4, fillcolor="orange", opacity=0.15, line_width=0, annotation_text="source 001: 2–4x",
              annotation_position="top left")
fig.add_hrect(y0=2, y1=8, fillcolor="gray", opacity=0.08, line_width=0, annotation_text="source 000: 2–8x",
              annotation_position="top right")
for batch, part in sweep.groupby("max_num_seqs"):
    fig.add_scatter(x=part.cv, y=part.speedup, mode="lines+markers", name=f"synthetic, max_num_seqs={batch} (simulated)",
                    error_y=dict(type="data", symmetric=False, array=part["max"] - part.speedup,
                                 arrayminus=part.speedup - part["min"]))
fig.add_scatter(x=[doc_cv], y=[replayed], mode="markers", marker=dict(size=12, symbol="diamond"),
                name="docstrings lengths, max_num_seqs=8 (simulated H100)")
fig.add_scatter(x=[doc_cv], y=[tput["continuous"] / tput["static"]], mode="markers",
                marker=dict(size=12, symbol="star"), name="docstrings, max_num_seqs=8 (measured on this CPU)")
fig.update_layout(xaxis_title="spread of output lengths (coefficient of variation)",
                  yaxis_title="in-flight / static throughput", yaxis_range=[0, 8.5], height=420,
                  title="The speed-up of in-flight batching grows with the spread of output lengths")
fig

# %%
flat = sweep[sweep.cv == 0]["max"]
top = sweep.iloc[sweep.speedup.idxmax()]
assert all(part.speedup.is_monotonic_increasing for _, part in sweep.groupby("max_num_seqs"))  # "grows with the spread"
say(f"Simulated. With equal lengths there is nothing to gain (at most {flat.max():.2f}x): no row finishes early. "
    f"The median gain grows with the spread and with the batch (a bigger batch waits for a longer longest row), to "
    f"**{top.speedup:.1f}x** in this sweep ({top['min']:.1f}–{top['max']:.1f}x over {len(SEEDS)} draws of the "
    f"lengths). The docstrings model's own lengths (cv {doc_cv:.2f}) give "
    f"{replayed:.1f}x on the simulated H100 and {tput['continuous'] / tput['static']:.1f}x measured on this CPU.")

# %% [markdown]
# > **Sources 000 and 001, checked.** Source `000` is right that the gain depends on the
# > spread of lengths; it also depends on the batch size, and with equal lengths and a full
# > queue there is no throughput gain at all, which source `001`'s single range leaves out.
# > (Under arrivals, static batching still makes a newcomer wait for the running batch,
# > whatever the lengths: section 4.)
#
# A throughput ratio like these is measured with a full queue, as here; under a light load
# both policies keep up, and the difference moves into latency: the next section.

# %% [markdown]
# ## 4. Waiting for the table: queueing delay and the P99
#
# Now requests arrive over time and are served by Llama-3-8B on an H100, **simulated** by
# the cost model, so the numbers are the same on every machine. The arrivals are a
# **Poisson process**, the usual model of many independent users: requests come at a
# constant average rate, each at a moment that does not depend on the others, so the gaps
# between them are exponentially distributed and requests sometimes bunch up. A request
# that arrives mid-batch waits until the whole batch is done; in-flight batching admits it
# at the next step.
#
# Three latencies describe what a user waits for: the **time to first token (TTFT)**,
# from arrival to the first output token (queueing delay plus prefill); the **time per
# output token (TPOT)**, the mean gap between the later tokens; and the **end-to-end
# (e2e) latency**, arrival to last token. Each is reported as percentiles over requests:
# **p50** is the median request, **p99** the 99th percentile: the tail a busy service
# is judged by.

# %%
# NBVAL_CHECK_OUTPUT
def simulate(policy, specs, **knobs):
    engine = simulated_engine("llama-3-8b", "h100", policy=policy, **knobs)
    engine.add_workload(specs)
    return engine.run()


RATE = 4.0  # requests per second
online = make_workload("mixed", num_requests=40, seed=1, rate=RATE, vocab_size=128256)
runs = {p: simulate(p, online, max_num_seqs=8) for p in ("static", "continuous")}
for p, t in runs.items():
    waits = [r.t_scheduled - r.arrival for r in t.requests]
    m = summarize(t)
    print(f"{p:10s}: queueing delay mean {sum(waits) / len(waits):6.2f} s, max {max(waits):6.2f} s; "
          f"TTFT p50 {m['ttft_p50']:6.2f} s, p99 {m['ttft_p99']:6.2f} s (simulated, {RATE:g} requests/s)")

# %%
widgets.gantt_figure(runs["static"], title="static batching, Llama-3-8B on an H100 (simulated)")

# %% [markdown]
# Raise the arrival rate and watch the tail:

# %%
# NBVAL_CHECK_OUTPUT
def batch_return_p99(tl):
    """e2e p99 if each request came back only with its whole batch, as `generate(batch)` returns
    (a static batch's rows are admitted in the same step, so they share t_scheduled)."""
    ends = {}
    for r in tl.requests:
        ends[r.t_scheduled] = max(ends.get(r.t_scheduled, 0.0), r.t_finished)
    return np.percentile([ends[r.t_scheduled] - r.arrival for r in tl.requests], 99)


rows = []
for rate in (1, 2, 4, 8, 16, 32):
    work = make_workload("mixed", num_requests=80, seed=1, rate=float(rate), vocab_size=128256)
    for policy in ("static", "continuous"):
        t = simulate(policy, work, max_num_seqs=8)
        m = summarize(t)
        rows.append({"rate": rate, "policy": policy, "ttft_p50": m["ttft_p50"], "ttft_p99": m["ttft_p99"],
                     "e2e_p99": m["e2e_p99"], "e2e_p99_batch": batch_return_p99(t) if policy == "static" else None,
                     "out_tok_s": m["output_tok_per_s"]})
load = pd.DataFrame(rows)
HEADERS = {"rate": "rate (req/s)", "ttft_p50": "TTFT p50 (s)", "ttft_p99": "TTFT p99 (s)", "e2e_p99": "e2e p99 (s)",
           "e2e_p99_batch": "e2e p99, whole batch returned (s)", "out_tok_s": "out tok/s"}
print("simulated, Llama-3-8B on an H100, max_num_seqs=8")
print(load.round(2).round({"out_tok_s": 0}).rename(columns=HEADERS).to_string(index=False, na_rep="-"))

# %%
from plotly.subplots import make_subplots

fig = make_subplots(rows=1, cols=2, subplot_titles=("time to first token", "output tokens/s"))
for i, (policy, part) in enumerate(load.groupby("policy", sort=False)):
    color = widgets.latency.policy_color(policy, i)
    fig.add_scatter(x=part.rate, y=part.ttft_p99, name=f"{policy} p99", line=dict(color=color), row=1, col=1)
    fig.add_scatter(x=part.rate, y=part.ttft_p50, name=f"{policy} p50", line=dict(color=color, dash="dot"),
                    row=1, col=1)
    fig.add_scatter(x=part.rate, y=part.out_tok_s, name=f"{policy}", line=dict(color=color), showlegend=False,
                    row=1, col=2)
fig.update_xaxes(type="log", title_text="arrival rate (requests/s)")
fig.update_yaxes(type="log", title_text="seconds", row=1, col=1)
fig.update_yaxes(title_text="output tokens/s", row=1, col=2)
fig.update_layout(title="Static vs in-flight batching under load (simulated)", height=400)
fig

# %%
st, ct = (load[load.policy == p].set_index("rate") for p in ("static", "continuous"))
low = min(load.rate)
assert st.ttft_p99[low] > 10 * ct.ttft_p99[low] and st.ttft_p99.is_monotonic_increasing  # the verdict below
say(check("001", "Queueing delay \"avalanches\" and the P99 response time \"worsens extremely\" "
                 "(排队延迟雪崩 … P99 响应延迟极度恶化).",
          f"Right. Even at {low} request/s, static batching's TTFT p99 is **{st.ttft_p99[low]:.2f} s** against "
          f"{ct.ttft_p99[low] * 1e3:.0f} ms in flight: a request that arrives just after a batch started waits "
          f"for that batch's longest row. Static batching's throughput stops growing at about "
          f"**{st.out_tok_s.max():.0f}** output tokens/s; past that rate its queue grows for as long as requests "
          f"keep coming, and the p99 with it ({st.ttft_p99.max():.1f} s at {max(load.rate)} requests/s), while "
          f"in-flight batching serves up to {ct.out_tok_s.max():.0f} tokens/s. Returning each request only with "
          f"its whole batch, as a plain `generate(batch)` does, adds more: static e2e p99 "
          f"{st.e2e_p99[low]:.2f} s streamed, {st.e2e_p99_batch[low]:.2f} s returned with the batch, at {low} "
          f"request/s."))

# %% [markdown]
# **What to remember.** Static batching computes padding (uneven prompts, rows that
# finished early), holds the places of finished rows until the longest one ends, and
# makes new requests wait for the slowest member of the running batch. How much that
# costs depends on how uneven the output lengths are: nothing when they are equal, a
# several-fold loss of throughput and a long latency tail for lengths set by EOS. Orca
# (Yu et al., OSDI 2022) named the fix *iteration-level scheduling*: decide the batch again
# at every step. That is lesson 3.
#
# **Exercise 2** (`exercises/02_static_batching.ipynb`): predict the padding of static
# batching from the lengths alone, and check your rule against the engine; then with the
# queue sorted by prompt length.
