# %% [markdown]
# # 8b · Prefix caching, part 2: the radix tree and the queue's order
#
# Lesson 8 built the prefix cache as vLLM does: a hash table of full blocks, each named by
# a key that chains its parent's. This lesson puts it beside SGLang's radix tree, shows
# how the order of the waiting queue decides what a small cache keeps, and draws shared
# and cached-but-free blocks in the KV map. The helpers are lesson 8's, section 3: a
# workload of a few long system prompts, each followed by a short user turn, and a
# simulated Llama-3-8B on an H100.

# %%
import random

import numpy as np
import plotly.graph_objects as go
from minilm import make_workload, summarize
from minilm.sim import simulated_engine
from minilm.workload import system_prompt_workload
from labs.prose import say
import widgets

BLOCK = 16
LLAMA3_VOCAB = 128256


def simulate(specs, **knobs):
    knobs = {"policy": "continuous", "max_num_seqs": 64, "max_model_len": 4096, "record_kv_blocks": False, **knobs}
    engine = simulated_engine("llama-3-8b", "h100", **knobs)
    engine.add_workload(specs)
    return engine.run()

# %% [markdown]
# ## 1. The prompts as a radix tree, beside the hash table
#
# SGLang keeps its cache as a **radix tree** (a compressed trie) over token ids: each
# path from the root spells a prefix some request had, and an edge holds a run of tokens
# that no prompt branches inside. Here are the prompts of a small `shared-prefix`
# workload: each node is labelled with its edge's token count and the number of requests
# whose prompt runs through it (hover for its tokens).

# %%
tree_specs = make_workload("shared-prefix", num_requests=16, seed=0)
widgets.radix_figure(tree_specs)

# %% [markdown]
# The hash table holds the same information, sampled at block boundaries: a block's key
# names the prefix from the root to the end of that block, so the table's keys are the
# tree's prefixes of whole blocks. Looking up a prompt's keys one by one is walking
# down the tree a block at a time. Both therefore find the **same reuse up to block
# granularity**: the table's hit is the tree's longest match rounded down to a whole
# block (and both leave the last prompt token to compute). `widgets.prefix_hits` walks
# the requests in arrival order and asks each structure what an earlier prompt already
# computed; the last column is what the engine recorded when it ran the workload with a
# cache too big to evict anything.

# %%
# NBVAL_CHECK_OUTPUT
hits = widgets.prefix_hits(tree_specs, block_size=BLOCK)
tree_run = simulate(tree_specs, enable_prefix_caching=True, block_size=BLOCK)
hits["engine"] = hits.request.map({r.request_id: r.num_cached_tokens for r in tree_run.requests})
print(hits.to_string(index=False))

# %%
# NBVAL_CHECK_OUTPUT
assert (hits.engine == hits.block_hit).all() and (hits.radix_hit - hits.block_hit).between(0, BLOCK - 1).all()
say(f"Over the {len(hits)} requests the tree finds **{hits.radix_hit.sum()}** reusable tokens and the hash "
    f"table **{hits.block_hit.sum()}** ({hits.block_hit.sum() / hits.radix_hit.sum():.1%} of them), exactly what "
    f"the engine recorded; no request loses more than {(hits.radix_hit - hits.block_hit).max()} tokens, less than "
    f"one block of {BLOCK}.")

# %% [markdown]
# The rounding matters when prompts are short next to a block. The `docstrings` model's
# multi-turn workload is real text: every turn of a conversation resends the turns
# before it, so each conversation is a chain in the tree (hover to read the text).

# %%
from minilm.model.loader import resolve_model_path
from minilm.model.tokenizer import load_tokenizer
from widgets.radix import workload_prompts

tokenizer = load_tokenizer(resolve_model_path("docstrings"))
chat = workload_prompts(make_workload("docstrings-multi-turn", num_requests=9, seed=0), tokenizer.encode)
widgets.radix_figure(chat, decode=tokenizer.decode, title=f"docstrings-multi-turn: {len(chat)} prompts, real text")

# %%
# NBVAL_CHECK_OUTPUT
chat_hits = widgets.prefix_hits(chat, block_size=BLOCK)
total = sum(len(p) for p in chat.values())
say(f"These prompts are {min(map(len, chat.values()))}-{max(map(len, chat.values()))} tokens long. A token-level "
    f"tree would reuse **{chat_hits.radix_hit.sum() / total:.0%}** of their tokens, blocks of {BLOCK} only "
    f"**{chat_hits.block_hit.sum() / total:.0%}**. (SGLang's tree matches token by token; vLLM trades this "
    f"away for block-sized bookkeeping, and real prompts are usually far longer than a block.)")

# %% [markdown]
# ## 2. Longest prefix first, under a small cache
#
# A cache that cannot hold every system prompt must evict, and then the **order** in
# which waiting requests are admitted decides the hit rate. First come, first served
# (FCFS) takes them as they arrived, so system prompts alternate, each evicts another,
# and each comes back to a cold cache. SGLang's *cache-aware scheduling* sorts the
# waiting queue by the **longest cached prefix** first (`scheduling_policy="lpm"` here),
# so requests that can share what is in the cache now go while it is there.
#
# A burst of requests over several system prompts, all queued at once, on a KV cache
# that holds only a few of those prompts (Llama-3-8B on an H100, **simulated**):

# %%
# NBVAL_CHECK_OUTPUT
burst = system_prompt_workload(8, n=128)
NUM_BLOCKS = 500
orders = {order: simulate(burst, enable_prefix_caching=True, scheduling_policy=order, num_blocks=NUM_BLOCKS,
                          max_num_seqs=16) for order in ("fcfs", "lpm")}
big = summarize(simulate(burst, enable_prefix_caching=True, max_num_seqs=16))
print(f"KV cache: {NUM_BLOCKS} blocks of {BLOCK} tokens = {NUM_BLOCKS * BLOCK} tokens (simulated)")
for order, tl in orders.items():
    m = summarize(tl)
    ttfts = [r.t_first_token - r.arrival for r in tl.requests]
    print(f"{order}: hit rate {m['prefix_cache_hit_rate']:4.0%}, TTFT p50 {m['ttft_p50']:5.2f} s, "
          f"p99 {m['ttft_p99']:5.2f} s, max {max(ttfts):5.2f} s, {m['output_tok_per_s']:5.0f} output tok/s, "
          f"mean batch {m['mean_batch_size']:4.1f}, {m['preemptions']} preemptions")
print(f"(a cache that evicts nothing: hit rate {big['prefix_cache_hit_rate']:.0%})")

# %% [markdown]
# Each request coloured by its system prompt, in the order the engine admitted them:

# %%
first_token = {tuple(s.prompt_ids[:8]): None for s in burst}  # the first tokens name the system prompt
prompt_of = {s.id: list(first_token).index(tuple(s.prompt_ids[:8])) for s in burst}
admitted = {order: sorted(tl.requests, key=lambda r: (r.t_scheduled, r.request_id)) for order, tl in orders.items()}
# one heatmap, one row per order (plotly.js draws nothing for two one-row heatmaps on a category axis)
fig = go.Figure(go.Heatmap(z=[[prompt_of[r.request_id] for r in rows] for rows in admitted.values()],
                           y=list(admitted), colorscale="Turbo", colorbar=dict(title="system prompt"),
                           customdata=[[r.request_id for r in rows] for rows in admitted.values()],
                           hovertemplate="%{customdata}: system prompt %{z}<extra></extra>"))
fig.update_layout(xaxis_title="admission order", height=250,
                  title="which system prompt each admitted request carries (simulated)")
fig

# %%
# NBVAL_CHECK_OUTPUT
fcfs, lpm = (summarize(orders[o]) for o in ("fcfs", "lpm"))
assert lpm["ttft_p50"] < fcfs["ttft_p50"] and lpm["ttft_p99"] < fcfs["ttft_p99"]  # "falls" below
say(f"Longest-prefix-first raises the hit rate from {fcfs['prefix_cache_hit_rate']:.0%} to "
    f"**{lpm['prefix_cache_hit_rate']:.0%}** (a cache that evicts nothing reaches "
    f"{big['prefix_cache_hit_rate']:.0%}), the median TTFT falls from {fcfs['ttft_p50']:.2f} s to "
    f"**{lpm['ttft_p50']:.2f} s** and the p99 from {fcfs['ttft_p99']:.2f} s to {lpm['ttft_p99']:.2f} s, and throughput rises {lpm['output_tok_per_s'] / fcfs['output_tok_per_s']:.1f}x: "
    f"requests that share one copy of a prompt also fit the small cache together (mean batch "
    f"{fcfs['mean_batch_size']:.1f} -> {lpm['mean_batch_size']:.1f}).")

# %% [markdown]
# The order has a cost the median hides: a request whose prefix is not cached can be
# passed over while others keep the cache warm. The burst above ends, so everybody is
# served soon enough. A steady stream instead, in which a couple of system prompts are
# popular and the rest are rare:

# %%
# NBVAL_CHECK_OUTPUT
from minilm.workload import poisson_arrivals, spec

popularity = [0.5, 0.2, 0.12, 0.08, 0.06, 0.04]  # the share of requests behind each system prompt
rng_np = np.random.default_rng(0)
stream_systems = [rng_np.integers(0, LLAMA3_VOCAB, int(k)).tolist() for k in rng_np.integers(1024, 2048, 6)]
picks = rng_np.choice(len(popularity), 400, p=popularity)
arrivals = poisson_arrivals(rng_np, 10.0, 400)  # requests/s
stream = [spec(f"r{i}", stream_systems[k] + rng_np.integers(0, LLAMA3_VOCAB, int(rng_np.integers(8, 33))).tolist(),
               int(rng_np.integers(16, 65)), t) for i, (k, t) in enumerate(zip(picks, arrivals))]
groups = {"popular": picks < 2, "rare": picks >= 2}
tails = {}
for order in ("fcfs", "lpm"):
    tl = simulate(stream, enable_prefix_caching=True, scheduling_policy=order, num_blocks=400, max_num_seqs=16)
    ttft = np.array([r.t_first_token - r.arrival for r in sorted(tl.requests, key=lambda r: int(r.request_id[1:]))])
    for group, mask in groups.items():
        tails[order, group] = (np.percentile(ttft[mask], 99), ttft[mask].max())
        print(f"{order}: {group:7s} prompts ({mask.mean():.0%} of requests): TTFT p99 {tails[order, group][0]:.2f} s, "
              f"worst {tails[order, group][1]:.2f} s (simulated)")

# %%
# NBVAL_CHECK_OUTPUT
popular_gain, rare_gain = (tails["fcfs", g][0] / tails["lpm", g][0] for g in ("popular", "rare"))
assert popular_gain > 1 > rare_gain and tails["lpm", "rare"][1] > tails["fcfs", "rare"][1]  # the sentence below
say(f"Simulated: longest-prefix-first cuts the popular prompts' p99 TTFT from {tails['fcfs', 'popular'][0]:.2f} s "
    f"to **{tails['lpm', 'popular'][0]:.2f} s**. The rare prompts pay for it: their p99 gets worse, from "
    f"{tails['fcfs', 'rare'][0]:.2f} s to **{tails['lpm', 'rare'][0]:.2f} s**, and their worst TTFT from "
    f"{tails['fcfs', 'rare'][1]:.2f} s to **{tails['lpm', 'rare'][1]:.2f} s**.")

# %% [markdown]
# The gain goes to what is popular, because that is what stays cached; the rare
# prompts lose, at the tail and at the worst case. Under heavier load a plain
# longest-prefix order could pass a rare prompt over again and again, so an engine that
# orders by prefix needs a limit on how long a request may wait its turn.

# %% [markdown]
# ## 3. The KV map: shared blocks and cached-but-free blocks
#
# A handful of requests over two short system prompts, arriving one after another, on a
# cache of a couple of dozen blocks. In the KV map (lesson 4) a **dark** cell is a block in
# several block tables at once: one copy of a system prompt's K/V that several running
# requests read. A **pale orange** cell is a block nobody holds any more that still keeps
# its key: free, handed out again only when the free queue reaches it, and until then a
# hit for the next request with that prefix.

# %%
from minilm import RequestSpec

rng = random.Random(6)
systems = [[rng.randrange(1, 500) for _ in range(40)] for _ in range(2)]
small = [RequestSpec(f"r{i}", systems[i % 2] + [rng.randrange(1, 500) for _ in range(rng.randrange(4, 12))],
                     max_tokens=rng.randrange(8, 24), arrival=0.004 * i) for i in range(10)]
kv_run = simulated_engine("tiny", "cpu", policy="continuous", enable_prefix_caching=True, num_blocks=24,
                          max_num_seqs=4, block_size=BLOCK)
kv_run.add_workload(small)
kv_tl = kv_run.run()
widgets.kvmap_figure(kv_tl)

# %%
# NBVAL_CHECK_OUTPUT
shown, owner, reserved, holders, cached_free = widgets.kv_cells(kv_tl)
_, kept = kv_run.kv_manager.snapshot()  # the cache now, after the last step
say(f"Up to **{holders.max()}** block tables hold the same block at once, and shared blocks are in use in "
    f"{(holders > 1).any(axis=0).sum()} of the {len(kv_tl.steps)} steps. When the last request ends, "
    f"**{len(kept)}** of the {kv_run.config.num_blocks} blocks are free but keep a "
    f"cached prefix (hit rate {summarize(kv_tl)['prefix_cache_hit_rate']:.0%}).")

# %% [markdown]
# The step records count a shared block once. `kv_blocks_used` is the blocks that some
# request holds; `kv_tokens_stored` is the slots of those blocks that hold a token, a
# shared block's tokens once; the rest of their slots are unused (`kv_unused_slots`:
# the unfilled end of each sequence's last block). Summed request by request instead,
# the tokens would outnumber the slots. The step with the most sharing:

# %%
# NBVAL_CHECK_OUTPUT
from minilm.metrics import kv_unused_slots

busiest = max(kv_tl.steps, key=lambda s: sum(map(len, s.kv_blocks.values())) - s.kv_blocks_used)
contexts = {i.request_id: i.context_len for i in busiest.items}  # every running request decodes or prefills
assert set(contexts) == set(busiest.kv_blocks)
say(f"In step {busiest.step}, {len(busiest.kv_blocks)} block tables list {sum(map(len, busiest.kv_blocks.values()))} "
    f"blocks, **{busiest.kv_blocks_used}** different ones: {busiest.kv_blocks_used * BLOCK} slots. They hold "
    f"**{busiest.kv_tokens_stored}** tokens and leave {kv_unused_slots(busiest, BLOCK)} slots unused, while the "
    f"requests' contexts add up to {sum(contexts.values())} tokens.")

# %% [markdown]
# Eviction takes the free queue's head, the least recently freed block. A finished
# request frees its blocks last block first, so a sequence's first blocks, the ones
# most likely to be shared, are the last to go: the hash table evicts from the leaves
# of the tree inward, as SGLang's radix tree does.

# %% [markdown]
# **What to remember.** A radix tree finds the same reuse as the hash table, token by
# token where the table goes block by block, so the table loses less than a block per
# request. Under a tight cache, the order of the queue decides the hit rate:
# longest-prefix-first keeps popular prefixes warm and makes the rare ones wait, so an
# engine that orders by prefix needs a limit on waiting.
#
# **Exercise 8** (`exercises/08_prefix_caching.ipynb`), its second part: a
# longest-prefix-first order with a limit on waiting.
