# %% [markdown]
# # 8 · Prefix caching
#
# Real traffic repeats itself. A chatbot puts the same system prompt in front of every
# user's message; an agent sends the same tool descriptions and few-shot examples with
# every call; a chat resends the whole conversation at every turn. Without a cache, the
# engine computes the keys and values (K/V) of those repeated tokens again for every
# request: the same prefill work, over and over.
#
# It need not. With causal attention, a token's K/V in every layer depends only on the
# tokens before it, its own token and its position. Two requests that start with the same
# tokens therefore have the same K/V for that start, so the engine can compute it once
# and let the second request **share the blocks** (lesson 4) that hold it. vLLM calls
# this *automatic prefix caching*; SGLang's *RadixAttention* does the same with a radix
# tree (Zheng et al., 2024, on the sources' reading list). The engine here follows
# vLLM's design (`minilm/core/prefix_cache.py`), behind vLLM's knob
# `enable_prefix_caching`, which lessons 0–7 leave off (section 4 says why).

# %%
from minilm import Engine, RequestSpec, make_workload, run_workload, summarize
from minilm.sim import simulated_engine
from labs.prose import say
import widgets

# %% [markdown]
# ## 1. What is reused, and why the unit is a block
#
# One system prompt, three requests served one after the other: `a`, then `b` with the
# same system prompt and another user turn, then `c` with exactly `a`'s prompt again.
# The engine records, for each request, how many prompt tokens it found in the cache.

# %%
# NBVAL_CHECK_OUTPUT
import random

rng = random.Random(8)
system = [rng.randrange(1, 500) for _ in range(40)]  # the system prompt: 40 tokens
turn_a, turn_b = ([rng.randrange(1, 500) for _ in range(n)] for n in (8, 9))
prompts = {"a": system + turn_a, "b": system + turn_b, "c": system + turn_a}  # c: a's prompt again
BLOCK = 16


def serve_one_by_one(caching: bool) -> Engine:
    engine = Engine("tiny", enable_prefix_caching=caching, block_size=BLOCK)
    for rid, prompt in prompts.items():  # each arrives after the previous one has finished
        engine.add_request(rid, prompt, max_tokens=4, ignore_eos=True)
        engine.run()
    return engine


engine = serve_one_by_one(caching=True)
cached = {r.request_id: r.num_cached_tokens for r in engine.timeline.requests}
for r in engine.timeline.requests:
    print(f"{r.request_id}: {r.prompt_len} prompt tokens, {r.num_cached_tokens} from the cache, "
          f"{r.prompt_len - r.num_cached_tokens} computed")
uncached = serve_one_by_one(caching=False)
same = all(engine.requests[rid].output_ids == uncached.requests[rid].output_ids for rid in prompts)
print("the same output tokens as with caching off:", same)

# %% [markdown]
# Two rules shape these numbers.
#
# **Only whole blocks are shared.** The cache is paged: a block table lists whole blocks,
# and a block is either in one table or shared by several. `b` has the whole system
# prompt in common with `a`, but the system prompt ends inside a block, and `b` must
# write its own turn into the rest of that block, where `a`'s turn sits. So that block
# cannot be shared: `b` recomputes the system prompt's tail along with its turn. Naming
# blocks, not tokens, also keeps the table small: one entry per block. The price is up
# to one block of recomputed tokens per request (lesson 8b, section 1, measures it).
#
# **The last prompt token is always computed.** The cache holds K and V, not the logits
# that the first output token is sampled from; those come out of the model only for a
# token the step computes. `c`'s prompt is entirely cached, yet the engine takes only the
# blocks *before* the one holding the last token, and computes that whole block.

# %%
# NBVAL_CHECK_OUTPUT
assert cached["b"] == cached["c"] == len(system) // BLOCK * BLOCK and same
say(f"`b` shares {len(system)} system-prompt tokens with `a` and takes **{cached['b']}** of them from the "
    f"cache ({cached['b'] // BLOCK} whole blocks of {BLOCK}). `c` repeats `a`'s {len(prompts['c'])} tokens, "
    f"{len(prompts['c']) // BLOCK} whole blocks, and still computes **{len(prompts['c']) - cached['c']}** "
    f"of them: the block with its last token. The outputs are the same tokens as without caching.")

# %% [markdown]
# ## 2. The hash chain
#
# How does the engine find a cached block? Every full block gets a **key**: its parent
# block's key (hashed) together with its own token ids; the first block, which has no
# parent, gets the root value 0 in its place. A new request computes the keys of its full
# blocks and looks them up in a dictionary key -> block, from its first block on, until
# one is missing. Here are the keys of `a`'s blocks:

# %%
from minilm.core.prefix_cache import block_keys

a = engine.requests["a"]
for i, (parent, tokens) in enumerate(block_keys(a, BLOCK, len(a.prompt_ids) // BLOCK)):
    shown = f"{parent} (the root)" if i == 0 else f"{parent & 0xFFFFFFFF:08x}…"
    print(f"block {i}: parent {shown:12s} tokens {list(tokens[:4])}…  -> the key hashes to "
          f"{hash((parent, tokens)) & 0xFFFFFFFF:08x}…, the next block's parent")

# %% [markdown]
# Because each key contains its parent's hash, a key names the **whole prefix** up to the
# end of its block, not just the block's own tokens (as long as no two prefixes hash
# alike: see the appendix). That is what correctness needs: equal tokens
# after a different start are a different prefix, and their K/V differ. Request
# `x` below has `a`'s second and third blocks, token for token, after a different first
# block.

# %%
x_prompt = [rng.randrange(1, 500) for _ in range(BLOCK)] + prompts["a"][BLOCK:]
engine.add_request("x", x_prompt, max_tokens=1, ignore_eos=True)
engine.run()
x = engine.requests["x"]
same_tokens = [x.block_keys[i][1] == a.block_keys[i][1] for i in range(3)]
same_keys = [x.block_keys[i] == a.block_keys[i] for i in range(3)]
print("blocks 0, 1, 2 -- same tokens as a's:", same_tokens, " same keys:", same_keys,
      " x found in the cache:", x.num_cached_tokens, "tokens")

# %% [markdown]
# Were the keys wrong to differ? Compare the K/V that `a` and `x` really hold for their
# second block, layer by layer (the KV cache tensor is
# `[layers, K/V, blocks, block_size, kv_heads, head_dim]`):

# %%
import plotly.graph_objects as go


def block_table(rid: str) -> list[int]:
    """A finished request's block table, as the last step it ran in recorded it."""
    return next(s.kv_blocks[rid] for s in reversed(engine.timeline.steps) if rid in (s.kv_blocks or {}))


kv = engine.executor.kv_cache
kv_a, kv_x = kv[:, :, block_table("a")[1]], kv[:, :, block_table("x")[1]]
diff = (kv_a - kv_x).abs().amax(dim=(2, 3, 4))  # [layers, K/V]: the largest difference
scale = kv_a.abs().amax(dim=(2, 3, 4))
fig = go.Figure([go.Bar(name=name, x=list(range(kv.shape[0])), y=diff[:, j].tolist()) for j, name in enumerate("KV")])
fig.update_layout(title="block 1: the same tokens after a different block 0 (tiny model, this CPU)",
                  xaxis_title="layer", yaxis_title="largest |difference|", height=320)
fig

# %%
# NBVAL_IGNORE_OUTPUT
assert diff[0].max() < 1e-5 * scale[0].max() and (diff[1:] > 1e-2 * scale[1:]).all()
say(f"Layer 0's K/V of the two copies agree (largest difference {diff[0].max():.1e}): there a token's K/V "
    f"depends only on the token and its position. From layer 1 on they differ by up to "
    f"{diff[1:].max():.2f}, against values of up to {scale[1:].max():.2f}: attention has mixed every earlier "
    f"token into them. A key of the block's own tokens alone would have handed `x` the wrong K/V.")

# %% [markdown]
# ## 3. Hit rate, TTFT and throughput
#
# The *hit rate* (vLLM's metric) is the share of prompt tokens found in the cache. The
# `shared-prefix` workload puts one of a few long system prompts in front of each short
# user turn. On this CPU with the tiny model, twice: all requests queued at once, which
# makes throughput the engine's capacity, and arriving at random (Poisson) at a moderate
# rate, which makes TTFT a request's own wait and prefill rather than time spent in a
# long queue. **Measured** times: they vary from run to run.

# %%
# NBVAL_IGNORE_OUTPUT
cpu_runs = {}
for arrivals, rate in (("queued at once", None), ("at 4 req/s", 4.0)):
    specs = make_workload("shared-prefix", num_requests=24, seed=0, rate=rate)
    for caching in (False, True):
        cpu_runs[arrivals, caching] = run_workload(specs, enable_prefix_caching=caching, max_num_seqs=16,
                                                   record_kv_blocks=False, sampling={"ignore_eos": True})
cpu = {key: summarize(tl) for key, tl in cpu_runs.items()}
for (arrivals, caching), m in cpu.items():
    computed = sum(s.tokens() for s in cpu_runs[arrivals, caching].steps)
    print(f"{arrivals:14s} caching {'on ' if caching else 'off'}: hit rate {m['prefix_cache_hit_rate']:4.0%}, "
          f"{computed:6d} tokens computed, {m['output_tok_per_s']:4.0f} output tok/s, "
          f"TTFT p50 {m['ttft_p50'] * 1e3:7.1f} ms, p99 {m['ttft_p99'] * 1e3:7.1f} ms (measured)")

# %% [markdown]
# The Gantt charts of the random arrivals: the orange stripe over a request's first step
# is the part of its prompt it found in the cache.

# %%
widgets.compare_figure({f"caching {'on' if c else 'off'}": cpu_runs["at 4 req/s", c] for c in (False, True)})

# %%
# NBVAL_IGNORE_OUTPUT
off, on = cpu["queued at once", False], cpu["queued at once", True]
off_r, on_r = cpu["at 4 req/s", False], cpu["at 4 req/s", True]
assert on_r["ttft_p50"] < off_r["ttft_p50"]  # "fell" below; the p99 is reported as it came out
say(f"With caching the engine found **{on['prefix_cache_hit_rate']:.0%}** of the prompt tokens in the cache. "
    f"Queued at once, it produced **{on['output_tok_per_s'] / off['output_tok_per_s']:.1f}x** the output "
    f"tokens per second; arriving at random, the median TTFT fell from {off_r['ttft_p50'] * 1e3:.0f} ms to "
    f"{on_r['ttft_p50'] * 1e3:.0f} ms (**{off_r['ttft_p50'] / on_r['ttft_p50']:.1f}x** lower), and the p99 went "
    f"from {off_r['ttft_p99'] * 1e3:.0f} ms to {on_r['ttft_p99'] * 1e3:.0f} ms. The median is one request's own "
    f"prefill, which a hit shortens; the p99 of {len(cpu_runs['at 4 req/s', True].requests)} requests is the "
    f"slowest one or two, those that arrived together or behind a long prefill, and on a shared CPU it moves from "
    f"run to run (measured on this machine).")

# %% [markdown]
# How do the gains grow with the hit rate? On a GPU, at serving scale: Llama-3-8B on an
# H100, **simulated**, with system prompts of a realistic one to two thousand tokens
# (the workload's sizes are in the code). The number of different system prompts sets
# the hit rate: one prompt for everybody, a few, many, or about one per request.
# Throughput with all requests queued at once; TTFT with Poisson arrivals at half the
# rate the engine sustains without caching.

# %%
# NBVAL_CHECK_OUTPUT
import numpy as np
import pandas as pd
from minilm.workload import system_prompt_workload

LLAMA3_VOCAB = 128256
N_REQUESTS = 200


def simulate(specs, **knobs):
    knobs = {"policy": "continuous", "max_num_seqs": 64, "max_model_len": 4096, "record_kv_blocks": False, **knobs}
    engine = simulated_engine("llama-3-8b", "h100", **knobs)
    engine.add_workload(specs)
    return engine.run()


base = summarize(simulate(system_prompt_workload(1, n=N_REQUESTS)))  # no caching, everything queued at once
capacity = base["requests"] / base["wall_s"]  # requests/s the engine sustains without caching
RATE = round(0.5 * capacity, 1)
rows = []
for k in (1, 4, 16, 64, N_REQUESTS):  # the last: about one system prompt per request
    for caching in (False, True):
        offline = summarize(simulate(system_prompt_workload(k, n=N_REQUESTS), enable_prefix_caching=caching))
        online = summarize(simulate(system_prompt_workload(k, RATE, N_REQUESTS), enable_prefix_caching=caching))
        rows.append({"system prompts": k, "caching": "on" if caching else "off",
                     "hit rate": offline["prefix_cache_hit_rate"], "out tok/s": offline["output_tok_per_s"],
                     "TTFT p50 (ms)": 1e3 * online["ttft_p50"], "TTFT p99 (ms)": 1e3 * online["ttft_p99"]})
sweep = pd.DataFrame(rows)
print(f"TTFT at {RATE} req/s (half of {capacity:.1f}, the uncached capacity); simulated")
print(sweep.round({"hit rate": 3, "out tok/s": 0, "TTFT p50 (ms)": 1, "TTFT p99 (ms)": 1}).to_string(index=False))

# %%
from plotly.subplots import make_subplots

pairs = sweep.pivot(index="system prompts", columns="caching")
hit = pairs["hit rate", "on"]
speedup = pairs["out tok/s", "on"] / pairs["out tok/s", "off"]
ttft_gain = pairs["TTFT p50 (ms)", "off"] / pairs["TTFT p50 (ms)", "on"]
tail_gain = pairs["TTFT p99 (ms)", "off"] / pairs["TTFT p99 (ms)", "on"]
fig = make_subplots(rows=1, cols=2, subplot_titles=["throughput, on / off", "TTFT p50, off / on"])
labels = [f"{k} prompt{'s' if k > 1 else ''}" for k in pairs.index]
fig.add_scatter(x=hit, y=speedup, text=labels, mode="markers+lines+text", textposition="top left", name="simulated",
                row=1, col=1)
fig.add_scatter(x=hit, y=1 / (1 - hit), mode="lines", line=dict(dash="dot"), name="1 / (1 - hit rate)",
                row=1, col=1)
fig.add_scatter(x=hit, y=ttft_gain, text=labels, mode="markers+lines+text", textposition="top left",
                name="simulated ", row=1, col=2)
fig.update_yaxes(type="log", title_text="x better with caching")
fig.update_xaxes(title_text="hit rate")
fig.update_layout(height=380, title="Llama-3-8B on an H100, simulated: the gain against the hit rate")
fig

# %% [markdown]
# The dotted line is the gain if prefill were all the work: skipping a share `h` of the
# prompt tokens would then make the engine `1 / (1 - h)` times faster. The engine gains
# much less, because decoding is untouched: the output tokens still need every decode
# step they needed before, and each decode step still reads all the weights and the
# whole KV cache (lesson 1). The TTFT gain is largest where one prefill of a long prompt
# was most of a request's wait.
#
# > SGLang's paper (Zheng et al., 2024) reports up to 6.4x higher throughput than
# > other systems on workloads with shared prefixes; that compares whole systems on its
# > own multi-call benchmarks, not caching on and off in one engine.

# %%
# NBVAL_CHECK_OUTPUT
best = speedup.idxmax()
assert (ttft_gain > 1).all() and (tail_gain > 1).all()  # "falls" below, median and tail
SGLANG_UP_TO = 6.4  # Zheng et al., 2024, as cited above
say(f"In the simulation, caching gives at best **{speedup.max():.1f}x** the throughput, when the {N_REQUESTS} "
    f"requests share {best} system prompt{'s' if best > 1 else ''} (hit rate {hit[best]:.0%}; SGLang's up to "
    f"{SGLANG_UP_TO}x, cited above, compares whole systems), and {speedup.iloc[-1]:.1f}x with "
    f"{pairs.index[-1]} prompts (hit rate {hit.iloc[-1]:.0%}); the median TTFT falls "
    f"{ttft_gain.min():.1f}-{ttft_gain.max():.1f}x and the p99 {tail_gain.min():.1f}-{tail_gain.max():.1f}x.")

# %% [markdown]
# ## 4. Why vLLM turns it on by default, and why this lab does not
#
# > vLLM's V1 announcement (vLLM blog, 2025-01-26): prefix caching in V0 could cost
# > significant CPU time when the hit rate was low, so V0 left it off; V1 made the data
# > structures cheap, measured less than 1% lower throughput at a 0% hit rate and
# > several times higher throughput at high hit rates, and turned it on by default.
#
# What it costs here when nothing is shared: hashing and looking up the full blocks of a
# prompt that is not in the cache, against the prefill of that same prompt, which the
# lookup could have saved (**measured** on this CPU, tiny model).

# %%
# NBVAL_IGNORE_OUTPUT
import time
from minilm.core.kv_cache import KVCacheManager
from minilm.request import Request, SamplingParams

prompt_len = 2000  # long, and with its one output token within the tiny model's positions
kv_manager = KVCacheManager(num_blocks=256, block_size=BLOCK, enable_prefix_caching=True)
fresh = [Request(f"p{i}", [rng.randrange(1, 500) for _ in range(prompt_len)], SamplingParams()) for i in range(20)]
t0 = time.perf_counter()
for req in fresh:  # new prompts: every lookup misses at the first block, after hashing all of them
    kv_manager.get_computed_blocks(req)
lookup_s = (time.perf_counter() - t0) / len(fresh)
hashed = len(fresh[0].block_keys)  # the full blocks before the last prompt token
# the prefill of the same prompts, caching off: the work a hit on all those blocks would have skipped
prefill_engine = Engine("tiny", max_model_len=prompt_len + 1, block_size=BLOCK)
for req in fresh[:3]:
    prefill_engine.add_request(req.request_id, req.prompt_ids, max_tokens=1, ignore_eos=True)
    prefill_engine.run()
prefill_s = np.median([s.duration for s in prefill_engine.timeline.steps if s.tokens() == prompt_len])
print(f"lookup of a missing {prompt_len}-token prompt {lookup_s * 1e3:.3f} ms; its prefill {prefill_s * 1e3:.1f} ms")

# %%
# NBVAL_IGNORE_OUTPUT
assert lookup_s < 0.05 * prefill_s  # "a small fraction" below, with a wide margin for a busy CPU
say(f"Hashing and looking up the {hashed} full blocks of a {prompt_len}-token prompt that misses takes "
    f"**{lookup_s * 1e3:.2f} ms** here, once per request; prefilling that prompt took {prefill_s * 1e3:.0f} ms "
    f"(median of {len(fresh[:3])}; measured). A miss costs **{lookup_s / prefill_s:.1%}** of that prefill, "
    f"almost all of which a hit on those {hashed} blocks would have skipped: a small price for a possible large "
    f"saving, which is why caching can stay on even when little is shared.")

# %% [markdown]
# So why do lessons 0–7 keep it off? Because their numbers would change, and not for the
# reasons those lessons teach. Their workloads often use repeated tokens, like lesson 6's
# example of one long prompt arriving among many decoding requests, all of them runs of
# the same token: with caching, most of those prompts would be found in the cache.

# %%
# NBVAL_CHECK_OUTPUT
NUM_DECODES, SHORT, LONG = 60, 256, 8192  # lesson 6, section 2


def lesson6_example(caching: bool):
    engine = simulated_engine("llama-3.1-8b", "h100", policy="continuous", max_num_seqs=64, max_model_len=8448,
                              enable_prefix_caching=caching, record_kv_blocks=False)
    specs = [RequestSpec(f"d{i}", [1] * SHORT, max_tokens=400) for i in range(NUM_DECODES)]
    specs.append(RequestSpec("long", [1] * LONG, max_tokens=32, arrival=1.0))
    engine.add_workload(specs)
    return engine.run()


for caching in (False, True):
    tl = lesson6_example(caching)
    long = next(r for r in tl.requests if r.request_id == "long")
    gaps = [b - a for r in tl.requests if r.request_id != "long" for a, b in zip(r.token_times, r.token_times[1:])]
    decode_hits = sum(r.num_cached_tokens for r in tl.requests if r.request_id != "long")
    ttft_long = long.t_first_token - long.arrival
    print(f"caching {'on ' if caching else 'off'}: the {NUM_DECODES} short prompts {decode_hits:5d} of "
          f"{NUM_DECODES * SHORT} tokens cached, the long prompt {long.num_cached_tokens:3d} of {LONG}; decodes "
          f"stall up to {max(gaps) * 1e3:5.1f} ms, the long prompt's TTFT {ttft_long * 1e3:5.1f} ms (simulated)")

# %% [markdown]
# Lesson 6's point survives (the long prompt still stalls the decodes), but its numbers
# move, and in other lessons a hit would hide exactly the prefill cost they measure.
# Preemption changes too: a recomputed request finds its own blocks again if they were
# not evicted meanwhile, so recomputing gets cheaper.

# %% [markdown]
# **What to remember.** Full blocks are named by a key that chains their parent's, so a
# key names a whole prefix; a new request shares the longest run of cached blocks from
# its start and always computes its last prompt token. Hits cut prefill work, so TTFT
# falls most and throughput rises as far as prefill was the bottleneck. Lesson 8b: the
# same reuse as a radix tree, and how the queue's order decides the hit rate under a
# tight cache.
#
# **Exercise 8** (`exercises/08_prefix_caching.ipynb`): write the block keys and the
# longest-cached-prefix lookup, and check them against the engine; then (after lesson
# 8b) a longest-prefix-first order with a limit on waiting.

# %% [markdown]
# ## Appendix: two details
#
# ### A. When two prefixes hash alike
#
# The dictionary of section 2 compares a block's own token ids exactly, but its parent
# only by Python's `hash()`.

# %%
# NBVAL_CHECK_OUTPUT
import sys

say(f"Two different prefixes whose {sys.hash_info.width}-bit hashes collide, followed by the same block of tokens, "
    f"get the same key, and the second request would read the first one's K/V. By accident that is rare; on "
    f"purpose it is not, because `hash()` of integers and tuples is the same in every process (the root is "
    f"{a.block_keys[0][0]}, as printed in section 2).")

# %% [markdown]
# > vLLM met exactly this (security advisory GHSA-rm76-4mrf-v9r8, 2025): its chains
# > started from `hash(None)`, a predictable constant since Python 3.12, so a crafted
# > prompt could collide with one in use; the fix made the start value random per run,
# > and SHA-256 became the default block hash in v0.10.2.
#
# This lab keeps `hash()` because it is short to read: do not serve users you do not
# trust with its prefix caching on.
#
# ### B. `reserved` mode with caching
#
# `reserved` mode (lesson 4) reserves a request's whole `prompt + max_tokens` when it is
# admitted. With caching, the blocks of its cached prefix are shared, not reserved anew.
# On a cache that holds few requests:

# %%
# NBVAL_CHECK_OUTPUT
mode_specs = make_workload("shared-prefix", num_requests=128, seed=0, vocab_size=LLAMA3_VOCAB, max_model_len=4096)
MODE_BLOCKS = 640
modes = []
for mode in ("reserved", "paged"):
    for caching in (False, True):
        tl = simulate(mode_specs, kv_mode=mode, num_blocks=MODE_BLOCKS, max_num_seqs=len(mode_specs),
                      enable_prefix_caching=caching)
        m = summarize(tl)
        modes.append({"kv_mode": mode, "caching": "on" if caching else "off", "mean batch (seqs)": m["mean_batch_size"],
                      "peak batch (seqs)": max(s.num_running for s in tl.steps),
                      "peak KV (blocks)": m["peak_kv_blocks"], "out tok/s": m["output_tok_per_s"]})
modes = pd.DataFrame(modes).round({"mean batch (seqs)": 1, "out tok/s": 0})  # as printed, and as the text says
print(f"{MODE_BLOCKS} KV blocks, {len(mode_specs)} shared-prefix requests queued at once (simulated)")
print(modes.to_string(index=False))

# %%
# NBVAL_CHECK_OUTPUT
res = modes.set_index(["kv_mode", "caching"])
reserved_on, paged_on = res.loc["reserved", "on"], res.loc["paged", "on"]
assert reserved_on["peak KV (blocks)"] == MODE_BLOCKS and paged_on["peak batch (seqs)"] == len(mode_specs)
assert reserved_on["mean batch (seqs)"] > res.loc["reserved", "off"]["mean batch (seqs)"]
say(f"Caching lets `reserved` mode hold each system prompt once: its mean batch grows from "
    f"{res.loc[('reserved', 'off'), 'mean batch (seqs)']:.1f} to **{reserved_on['mean batch (seqs)']:.1f}**. What "
    f"it still reserves is the output not yet generated, and on this cache that caps it: all {MODE_BLOCKS} blocks "
    f"for at most {reserved_on['peak batch (seqs)']:.0f} running, while `paged` runs all {len(mode_specs)} in "
    f"{paged_on['peak KV (blocks)']:.0f} blocks.")
