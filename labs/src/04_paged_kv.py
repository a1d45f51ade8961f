# %% [markdown]
# # 4 · The paged KV cache
#
# Every token a sequence has seen leaves a key and a value vector in every layer: the
# **KV cache**. Decode reads all of it at every step (lesson 1), and it is what limits
# how many sequences fit on a GPU at once: Llama-3-8B keeps 128 KiB per token in
# bfloat16, so a 4,096-token conversation holds 0.5 GiB.
#
# Before vLLM, engines gave each request one **contiguous** region big enough for its
# longest possible length, reserved when it was admitted. Most of it sits empty: the
# tokens not generated yet, and everything past the point where the request actually
# stops. vLLM's PagedAttention (Kwon et al., SOSP 2023) borrows the operating system's
# idea of **pages**: the cache is cut into fixed-size **blocks** (16 tokens here), a
# sequence gets a block only when it needs one, a **block table** maps its positions to
# blocks that can lie anywhere, and blocks go back to the free list the step the
# request ends. Only a sequence's last block can have empty slots.

# %% [markdown]
# ## 1. Blocks and block tables
#
# A tiny cache — 12 blocks of 4 tokens — and three requests. After each step we print
# every request's block table and the free list's size.

# %%
# NBVAL_CHECK_OUTPUT
from minilm import Engine, make_workload, summarize
import widgets

engine = Engine("tiny", policy="continuous", max_num_seqs=2, block_size=4, num_blocks=12, max_model_len=64)
engine.add_request("a", prompt_ids=[1] * 6, max_tokens=4, ignore_eos=True)
engine.add_request("b", prompt_ids=[1] * 3, max_tokens=7, ignore_eos=True)
engine.add_request("c", prompt_ids=[1] * 9, max_tokens=2, ignore_eos=True)
while engine.has_unfinished():
    s = engine.step()
    tables = "  ".join(f"{rid}:{blocks}" for rid, blocks in engine.kv_cache.block_tables.items())
    print(f"step {s.step}: free {engine.kv_cache.num_free_blocks:2d} | {tables}")

# %% [markdown]
# Tables are printed after each step, so a request that just finished has already given
# its blocks back. `a` (6 prompt tokens) holds 2 blocks; `b` (3 prompt tokens) takes a
# second block in step 2, when its 5th token needs a slot. When `a` finishes in step 3,
# its blocks go straight back to the free list, and in step 4 `c` — which waited for a
# place in the batch (`max_num_seqs=2`) — gets blocks 0 and 1 again, plus block 4.
# Block ids need not be contiguous: the block table is the only map.
#
# The KV map shows which request owns each block at each step (blank: free):

# %%
widgets.kvmap_figure(engine.timeline)

# %% [markdown]
# ## 2. A slot's address
#
# Token at position `p` of a sequence lives in block `table[p // block_size]`, at offset
# `p % block_size`. The flat *slot* `block * block_size + offset` is what the engine
# hands the kernel (the *slot mapping*, lesson 5) to write each new token's K and V.

# %%
# NBVAL_CHECK_OUTPUT
from minilm.kv_cache import KVCacheManager
from minilm.request import Request, SamplingParams

kv = KVCacheManager(num_blocks=8, block_size=4)
x, y = (Request(rid, prompt_ids=[1] * 9, params=SamplingParams(max_tokens=4)) for rid in "xy")
kv.allocate_slots(x, 5)      # x's first 5 tokens: 2 blocks
x.num_computed_tokens = 5    # (the scheduler does this after each step)
kv.allocate_slots(y, 3)      # 1 block
kv.allocate_slots(x, 4)      # x grows to 9 tokens: a 3rd block, after y's
table = kv.block_tables["x"]
print("tables:", kv.block_tables)
print("slots of x's tokens:", [table[p // 4] * 4 + p % 4 for p in range(9)])

# %% [markdown]
# ## 3. Reserved vs paged on the same memory
#
# Now the question that matters for serving: on the **same KV memory**, how many
# requests can run together, and what does that do to throughput? The engine's
# `kv_mode="reserved"` does it the pre-paging way: a request gets blocks for
# `prompt + max_tokens` when admitted. Here it even knows each request's exact output
# length, which a real server does not (it must reserve for `max_tokens` or the model's
# maximum length): this is the *kindest* case for reservation.
#
# Llama-3-8B on an H100 (**simulated**), 200 `mixed` requests all queued at t=0,
# `max_num_seqs=256`, and a KV cache of 512 blocks of 16 tokens (8,192 slots, 1 GiB).

# %%
# NBVAL_CHECK_OUTPUT
from minilm.simulator import simulated_engine

specs = make_workload("mixed", num_requests=200, seed=0, vocab_size=128256)
runs = {}
for mode in ("reserved", "paged"):
    engine = simulated_engine("llama-3-8b", "h100", policy="continuous", kv_mode=mode,
                              num_blocks=512, max_num_seqs=256)
    engine.add_workload(specs)
    runs[mode] = engine.run()
for mode, tl in runs.items():
    m = summarize(tl)
    slots = sum(s.kv_blocks_used for s in tl.steps) * 16
    unused = 1 - sum(s.kv_tokens_stored for s in tl.steps) / slots
    print(f"{mode:8s}: {unused:4.0%} of allocated slots empty, batch mean {m['mean_batch_size']:5.1f} "
          f"(peak {max(s.num_running for s in tl.steps)}), {m['output_tok_per_s']:5.0f} output tok/s, "
          f"{m['preemptions']} preemptions (simulated)")

# %% [markdown]
# Paging leaves only the last block of each sequence partly empty, so the same memory
# holds more sequences, the batch is bigger, and — decode being memory-bound — the extra
# sequences are almost free: throughput goes up. The price: a paged engine admits
# requests whose future tokens may not fit, so when blocks run out it must **preempt**
# (here: free the newest request's blocks and recompute it later, vLLM's default).
#
# The vLLM authors report that existing systems wasted 60–80% of KV memory to
# fragmentation and over-reservation and PagedAttention under 4% (project blog,
# 2023-06-20), and 2–4x the throughput of FasterTransformer and Orca at the same latency
# (SOSP 2023). The numbers above are this lab's own, for this workload.

# %%
import plotly.graph_objects as go

fig = go.Figure()
for mode, tl in runs.items():
    df = tl.steps_df()
    fig.add_scatter(x=df.t_start, y=df.num_running, name=f"{mode}: running requests", mode="lines")
fig.update_layout(xaxis_title="time (s, simulated)", yaxis_title="requests in the batch", height=350,
                  title="same KV memory, reserved vs paged (Llama-3-8B, H100, simulated)")
fig

# %% [markdown]
# **What to remember.** Blocks + block tables + a free list: memory is taken as a sequence
# grows and returned the step it ends. That turns wasted reservation into batch size,
# and batch size into throughput.
#
# **Exercise 4** (`exercises/04_paged_kv.ipynb`): write the block allocator.
