# %% [markdown]
# # 0 · Start here
#
# This lab teaches how LLM serving engines **batch requests**. You will run a small but
# complete inference engine, `minilm`, look at what it did step by step, and measure it.
# The engine is real: a Llama-family model, a paged KV cache, a scheduler with the same
# knobs as vLLM (`max_num_seqs`, `max_num_batched_tokens`, `block_size`, ...), and a
# **timeline** that records every engine step. Every number in these lessons is computed
# by the code you run; where a GPU-scale picture is needed, a *simulated* clock predicts
# step times for a real model on a real GPU, and the lesson says so.
#
# | lesson | idea | exercise (`labs/exercises/`) |
# |---|---|---|
# | 0 | this page: install check, generate text, the first Gantt chart | `00_start_here.ipynb` |
# | 1 | prefill vs decode: compute-bound vs memory-bound | `01_prefill_decode.ipynb` |
# | 2 | static batching: padding and bubbles | `02_static_batching.ipynb` |
# | 3 | in-flight (continuous) batching: check, evict, fill, execute | `03_continuous_batching.ipynb` |
# | 4 | the paged KV cache | `04_paged_kv.ipynb` |
# | 5 | inside the Triton kernel: one kernel for a ragged batch | `05_triton_kernel.ipynb` |
# | 6 | chunked prefill: a long prompt no longer stalls the decodes | `06_chunked_prefill.ipynb` |
# | 7 | trade-offs and SLOs: capacity, goodput, the sources' four misconceptions | `07_tradeoffs_slos.ipynb` |
# | 7b | hardware and cost: which GPU gains most, cost per token, GPUs for a service, the sources' risks | none |
# | 7c | what came next (Orca to DistServe, disaggregation) and what it is worth: inference vs training compute, token economics, not a moat, the edge | none |
# | 8 | prefix caching: shared prompt prefixes computed once, in whole blocks | `08_prefix_caching.ipynb` |
# | 8b | prefix caching, part 2: the radix tree, and the queue's order under a small cache | `08_prefix_caching.ipynb` (its second part) |
# | 9 | serving: an OpenAI-compatible server, its clients, the live Gantt | `09_serving.ipynb` |
# | 10 | speculative decoding and quantization: do the multipliers stack? | `10_speculative.ipynb` |
#
# Every lesson but 7b and 7c has an exercise in `labs/exercises/`, named in the table
# (8b shares lesson 8's; solutions, under the same names, in `labs/solutions/`). The first cell of every notebook (above)
# only makes `import minilm` work; the engine itself runs PyTorch on as many CPU threads as
# PyTorch would (`EngineConfig.cpu_threads`: `$OMP_NUM_THREADS` if set, else the machine's
# physical cores). The tiny model's ops are too small to share well, and on a busy laptop extra
# threads mostly wait on each other: if measured times jump around, pass `cpu_threads=1`
# (`--cpu-threads 1`), as lesson 9's servers and the notebooks' build do.
#
# ## Glossary
#
# The words the lessons use, each also defined where it first appears.
#
# | term | meaning | defined in |
# |---|---|---|
# | prefill | the step(s) that run a request's whole prompt through the model, filling its KV cache and sampling the first output token | lesson 1 |
# | decode | a step that feeds one new token per sequence and samples the next | lesson 1 |
# | KV cache | the keys and values every past token leaves in every layer, kept so decode does not recompute them | lessons 1, 4 |
# | block | a fixed-size piece of the KV cache (`block_size` tokens, `16` by default); a sequence's block table maps its positions to blocks | lesson 4 |
# | roofline | a step takes the larger of its compute time (FLOPs / peak FLOP/s) and its memory time (bytes / bandwidth); the ridge is where they meet | lesson 1 |
# | GQA | grouped-query attention: several query heads share one key/value head, so the KV cache is smaller | lessons 1, 5 |
# | SwiGLU | Llama's MLP: a gated pair of up projections, then a down projection | lesson 1 |
# | MFU / MBU | model FLOPs / bandwidth utilisation: the share of the peak FLOP/s, or of the memory bandwidth, a step attains | lesson 1 |
# | TTFT | time to first token: from a request's arrival to its first output token | lesson 2 |
# | TPOT | time per output token: the mean gap between a request's later tokens | lesson 2 |
# | ITL | inter-token latency: each gap between two consecutive tokens of a request | lesson 6 |
# | end-to-end latency | from a request's arrival to its last token | lesson 2 |
# | p50 / p99 | percentiles over requests (or gaps): the median, and the 99th percentile: the tail | lesson 2 |
# | chunk | a piece of a prompt run in one step, when the whole prompt does not fit the step | lesson 6 |
# | budget | `max_num_batched_tokens`: the most tokens one step may compute | lesson 6 |
# | preemption | taking a running request's KV blocks away when the cache is full; it goes back to the queue and is recomputed | lesson 3 |
# | SLO | service-level objective: a promised limit on a latency for a stated share of requests | lessons 6, 7 |
# | goodput | the rate of requests (or tokens) served within the SLO, not all of them | lesson 7 |

# %% [markdown]
# ## 1. Check the install
#
# The lab runs on a CPU. With a CUDA GPU, the engine uses it and its Triton kernel.

# %%
import platform
import plotly, minilm
print("python", platform.python_version(), "| torch", torch.__version__, "| plotly", plotly.__version__)
print("CUDA GPU:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU is fine)")

# %% [markdown]
# ## 2. Generate text
#
# An `Engine` holds a model, a KV cache and a scheduler. You give it requests (a prompt,
# how many tokens to generate) and it runs them, batched. `docstrings` is a small model
# shipped with the lab, trained on the docstrings of Python's standard library, so it
# writes docstring-like English and stops at its end-of-text token (its model card is
# `minilm/checkpoints/docstrings/README.md`). The `tiny` model has random weights: it
# writes noise, and serves the benchmarks.

# %%
from minilm import Engine, steps_df

MODEL = "docstrings"
engine = Engine(MODEL)
prompts = ["Return the", "Open a file and", "A Mapping is a"]
for prompt, text in zip(prompts, engine.generate(prompts, max_tokens=40)):
    print(f"{prompt!r} -> {text!r}")
print(f"({MODEL} model, {engine.model_config.num_params / 1e6:.1f} M parameters)")

# %% [markdown]
# ## 3. What the engine did
#
# The engine recorded a **timeline**: one record per engine step. The first step
# computed the three prompts at once (*prefill*); every later step computed one new
# token for each request still running (*decode*), until each one stopped — at its
# end-of-text token or at `max_tokens`. Lesson 1 is about why these two kinds of step
# cost so differently.

# %%
steps = steps_df(engine.timeline)
steps[["step", "duration", "prefill_tokens", "decode_tokens", "batch_size", "kv_blocks_used"]].head(6)

# %% [markdown]
# The same with the `tiny` model, a prompt given as token ids and `ignore_eos=True` is
# fully deterministic in its steps: the model may not stop early, so the request runs
# to exactly `max_tokens` output tokens. Each line below is one step: its number, then
# for each item (kind, tokens computed, context length after the step). Count the decode
# steps and compare them with `max_tokens`: where did the first output token come from?

# %%
# NBVAL_CHECK_OUTPUT
engine = Engine("tiny")
engine.add_request("r0", prompt_ids=list(range(12)), max_tokens=8, ignore_eos=True)
tl = engine.run()
for s in tl.steps:
    print(s.step, [(i.kind, i.num_tokens, i.context_len) for i in s.items])

# %% [markdown]
# ## 4. A small workload and its first Gantt chart
#
# A *workload* is a list of requests. `make_workload` draws seeded ones (`uniform`,
# `mixed`, `long-prompt`, `docstrings`, ...). Here a few requests arrive together, more
# than the engine may run at once (`max_num_seqs`), and it serves them with in-flight
# batching (`policy="continuous"`): each line of the first printout is one request's
# (id, prompt length, `max_tokens`).

# %%
# NBVAL_CHECK_OUTPUT
from minilm import make_workload, run_workload, summarize

MAX_NUM_SEQS = 4
specs = make_workload("uniform", num_requests=12, seed=0)
print([(s.id, len(s.prompt_ids), s.max_tokens) for s in specs[:4]], "...")
tl = run_workload(specs, policy="continuous", max_num_seqs=MAX_NUM_SEQS, sampling={"ignore_eos": True})
m = summarize(tl)
print(f"{m['requests']} requests, at most {MAX_NUM_SEQS} at a time: {m['steps']} steps, "
      f"{m['output_tokens']} output tokens, mean batch size {m['mean_batch_size']:.2f}")

# %% [markdown]
# Each row of the Gantt chart is a request; x is time in milliseconds (measured on this
# machine). The queue wait, the prefill and the decode tokens of every request are
# visible: the first few start at once, and each later one starts the moment a running
# request finishes and frees its place.

# %%
import widgets

widgets.gantt_figure(tl)

# %% [markdown]
# The run's numbers, in the table that the lessons, the lecture demo and `python -m
# minilm compare` all print: units in the headers, latencies in milliseconds. Measured on
# this machine, they vary from run to run.

# %%
widgets.metrics_table({"continuous": tl})

# %%
from labs.prose import say

say(f"**{m['output_tok_per_s']:.0f} output tokens/s** over {m['wall_s'] * 1e3:.0f} ms; half of the requests "
    f"had their first token within **{m['ttft_p50'] * 1e3:.1f} ms** of arriving (TTFT p50), the slowest after "
    f"{max(r.t_first_token - r.arrival for r in tl.requests) * 1e3:.0f} ms: they waited for a place.")

# %% [markdown]
# **Next:** lesson 1, prefill vs decode. The same command line runs from a terminal:
# `python -m minilm compare --workload mixed --policies static,continuous,chunked`.
