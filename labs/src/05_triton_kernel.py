# %% [markdown]
# # 5 · Inside the Triton kernel: one kernel for a ragged batch
#
# With in-flight batching and chunked prefill, one step holds very different pieces of
# work: a long prompt chunk, a decode of one token with a long context behind it,
# another decode with a short one... How does one attention call serve them all?
#
# * **Padding + masking** (the classic way, as in a padded `generate` call): make a
#   dense `[batch, max_query_len, max_context]` problem, pad every sequence to the
#   longest, and mask the padding away. Simple, but the padded positions are computed.
# * **Ragged** (vLLM's and SGLang's Triton backends, FlashAttention's varlen API):
#   concatenate every new token of the step into one flat list `q [T, heads, dim]`, and
#   describe the pieces with a few small tensors. No padding between sequences (a
#   kernel still rounds each piece up to its own tiles: section 4 counts it).
#
# This lesson builds the ragged description from a real step, measures what padding
# would cost, and runs `minilm/model/attention/triton_paged.py` against the reference.
#
# > **Source 000, checked.** TensorRT-LLM "aligns heterogeneous requests to one tensor shape
# > with padding and masks" (通过 padding 和 mask 将异构请求对齐到统一的 tensor shape 上执行),
# > while vLLM and SGLang handle the different lengths in the kernel.
# >
# > Not for TensorRT-LLM's in-flight batching. Its docs (*Paged Attention, IFB, and Request
# > Scheduling*): "the support for inflight batching requires the input tensors to be
# > packed (no padding)". Its older padded mode still exists ("may be removed in the
# > future"), unused by in-flight batching. All three engines run a mixed step ragged.

# %%
import os
# Triton runs on a CPU only in its interpreter, which must be switched on before `import triton`.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
from minilm import make_workload, run_workload
from minilm.model.attention import reference
from minilm.model.llama import AttentionMetadata
from labs.prose import say
import widgets

try:
    from minilm.model.attention import triton_paged
except ImportError:  # Triton has wheels for Linux only
    triton_paged = None
    print("Triton is not installed here (it has no macOS or Windows wheels): the cells that run the kernel "
          "say so in one line and skip; the rest of the lesson runs.")

# %% [markdown]
# ## 1. A real mixed step
#
# Run a small workload with chunked prefill (lesson 6) and pick the step with the most
# sequences that mixes a prompt chunk with decodes.

# %%
# NBVAL_CHECK_OUTPUT
specs = make_workload("uniform", num_requests=6, seed=0, max_model_len=256)
tl = run_workload(specs, policy="chunked", max_num_batched_tokens=64, max_num_seqs=6, max_model_len=256,
                  block_size=16, sampling={"ignore_eos": True})
mixed = [s for s in tl.steps if {i.kind for i in s.items} == {"prefill", "decode"}]
step = max(mixed, key=lambda s: (len(s.items), -s.step))
for i in step.items:
    print(f"{i.request_id}: {i.kind:7s} {i.num_tokens:3d} new tokens, context after the step {i.context_len:3d}, "
          f"blocks {step.kv_blocks[i.request_id]}")

# %% [markdown]
# ## 2. The ragged description
#
# `AttentionMetadata` (minilm/model/llama.py) is all the kernel needs:
#
# * `cu_seqlens_q` — where each sequence's new tokens start and end in the flat batch;
# * `context_lens` — how many keys each sequence attends to (cached + new);
# * `block_tables` — each sequence's blocks in the paged cache (lesson 4);
# * `slot_mapping` — the cache slot where each new token's K and V are written.
#
# The engine builds it in `minilm/model/runner.py`; here it is from the step's record.

# %%
# NBVAL_CHECK_OUTPUT
import torch

def metadata_of(step, block_size=16):
    q_lens = [i.num_tokens for i in step.items]
    ctx = [i.context_len for i in step.items]
    tables = [step.kv_blocks[i.request_id] for i in step.items]
    width = max(len(t) for t in tables)
    slots = [t[p // block_size] * block_size + p % block_size
             for q, c, t in zip(q_lens, ctx, tables) for p in range(c - q, c)]
    cu = torch.tensor([0] + q_lens).cumsum(0)
    return AttentionMetadata(cu_seqlens_q=cu.to(torch.int32), context_lens=torch.tensor(ctx, dtype=torch.int32),
                             block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
                             slot_mapping=torch.tensor(slots, dtype=torch.int64))

meta = metadata_of(step)
print("cu_seqlens_q:", meta.cu_seqlens_q.tolist())
print("context_lens:", meta.context_lens.tolist())
print("block_tables shape:", tuple(meta.block_tables.shape), "| slot_mapping:", len(meta.slot_mapping), "slots")

# %% [markdown]
# ## 3. What padding would cost
#
# Every cell below is one (query token, key) pair of the step above, for one head in
# one layer: padded, each sequence gets as many query rows as the step's largest piece
# of work and as many keys as its longest context; ragged, only the real tokens, each
# against its own keys (`widgets/masks.py` counts the cells):

# %%
widgets.masks_figure(step)

# %%
# NBVAL_CHECK_OUTPUT
n = widgets.mask_counts(step)
say(f"For this one step the padded layout computes **{n['padded']:,}** scores per head and layer, of which "
    f"**{n['needed']:,}** are used: **{n['padded'] / n['needed']:.0f}x** the work. Every sequence is padded to "
    f"the {max(i.num_tokens for i in step.items)} query rows of the largest prompt chunk and to the "
    f"{max(i.context_len for i in step.items)} keys of the longest context — the "
    f"{sum(i.kind == 'decode' for i in step.items)} one-token decodes most of all. It is the worst case, and a "
    f"step no padded engine builds: one that pads runs prompts and decodes in separate steps (lesson 2). Over a "
    f"whole run the factor is smaller (next cell).")

# %% [markdown]
# Over every step of the run, the padded layout computes `batch x max_query_len` query
# rows per step and `batch x max_query_len x max_context` scores per head; the ragged
# one computes `T` rows and the (causal) pairs each sequence really has:

# %%
# NBVAL_CHECK_OUTPUT
rows_padded = rows_ragged = pairs_padded = pairs_ragged = 0
for s in tl.steps:
    q = [i.num_tokens for i in s.items]
    c = [i.context_len for i in s.items]
    rows_padded += len(q) * max(q)
    rows_ragged += sum(q)
    pairs_padded += len(q) * max(q) * max(c)
    pairs_ragged += sum(n * ctx - n * (n - 1) // 2 for n, ctx in zip(q, c))
print(f"query rows: padded {rows_padded:,}, ragged {rows_ragged:,} ({rows_padded / rows_ragged:.1f}x)")
print(f"score entries: padded {pairs_padded:,}, ragged {pairs_ragged:,} ({pairs_padded / pairs_ragged:.1f}x)")
assert pairs_padded / pairs_ragged < n["padded"] / n["needed"]  # "smaller", above

# %% [markdown]
# This is what makes in-flight batching cheap. The scheduler (lessons 3 and 6) puts a
# prompt chunk and one-token decodes into the same step whenever a request joins, and the
# mix changes from step to step. Padded, each such step would bring static batching's
# waste (lesson 2) back inside the step: every decode computed as if it were as long as
# the chunk.

# %%
mixing = [s for s in tl.steps if {i.kind for i in s.items} == {"prefill", "decode"}]
mix_padded = sum(len(s.items) * max(i.num_tokens for i in s.items) for s in mixing)
mix_ragged = sum(i.num_tokens for s in mixing for i in s.items)
say(f"In this run **{len(mixing)}** of the {len(tl.steps)} steps mix a prompt chunk with decodes; padded, those "
    f"steps would compute **{mix_padded / mix_ragged:.1f}x** the query rows they need (the linear layers too, in "
    f"an engine that pads), and the whole run {pairs_padded / pairs_ragged:.1f}x the attention scores. Ragged, a "
    f"step costs its real tokens whatever the mix, so the scheduler can put any request into any step without a "
    f"padding bill: that is what iteration-level scheduling needs.")

# %% [markdown]
# Padding attention is only part of a padded engine's waste: its linear layers (the
# projections and the MLP) would also run on every padding row. In this engine they never
# need padding: they are per-token, so the whole flat batch goes through them as one
# matrix (Orca's *selective batching*, lesson 3), and only attention needs to know whose
# token is whose — which is what the metadata of section 2 tells it.

# %% [markdown]
# ## 4. How the kernel walks the ragged batch
#
# Read the docstring of `minilm/model/attention/triton_paged.py` beside this. In short:
#
# * the grid is (query blocks, KV heads); one program takes up to `BLOCK_Q` new tokens of
#   **one** sequence and all the query heads that share one KV head. That sharing is
#   **grouped-query attention (GQA)**: a model such as Llama-3-8B has fewer K/V heads than
#   query heads, each K/V head serving a group of query heads (the last cell of this
#   section prints its shape), which shrinks the KV cache by the group's size; here each
#   K/V tile a program loads serves the whole group;
# * a decode-only step of few sequences would give the GPU too few programs (one per
#   sequence and KV head, fewer than it has SMs, its compute units). `paged_attention`
#   then uses **flash-decoding** (Dao et al., 2023): it splits each context into segments
#   that run side by side, each producing a partial softmax over its keys, and merges them
#   with a second small kernel (`attention_split_kv`; the cell after the check below shows
#   the choice);
# * a program finds its sequence by binary search over `cu_seqlens_q`, so no per-program
#   table has to be built on the host;
# * it walks the sequence's keys tile by tile through the block table, keeping a running
#   maximum and sum of the softmax, so the score matrix never exists in memory. That is
#   **FlashAttention**'s idea (Dao et al., 2022): before it, attention wrote the whole
#   N × N score matrix to the GPU's memory and read it back for the softmax; computing the
#   softmax tile by tile ("online") keeps the scores in the chip's fast on-chip memory,
#   exact. Its extra memory grows with N instead of N²; its traffic to the GPU's memory
#   (HBM) still grows with N², but divided by the on-chip memory's size (Dao et al. count
#   O(N²d²/M) accesses for M bytes of on-chip memory, against O(Nd + N²) before), many
#   several times less for the head sizes in use. It is what
#   made long prompts affordable, and every serving kernel since, this one included, is
#   built that way;
# * the causal rule is one line: new token `j` of a sequence with `n` new tokens sits at
#   position `context_len - n + j` and sees keys `kv_pos < context_len - n + j + 1`. It
#   covers a whole prompt, a chunk continuing earlier chunks, and a decode (`n = 1`).
#
# Run it on the step above (in Triton's interpreter on a CPU: correct but slow) and
# compare it with the readable reference (`minilm/model/attention/reference.py`).

# %%
# NBVAL_CHECK_OUTPUT
import time

torch.manual_seed(0)
num_blocks, block_size, q_heads, kv_heads, dim = 64, 16, 8, 2, 32
k_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
v_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
q = torch.randn(len(meta.slot_mapping), q_heads, dim)
print(f"{len(q)} query tokens of {len(meta.context_lens)} sequences, {q_heads} query heads on {kv_heads} KV heads")
if triton_paged is None:
    print("The kernel needs Triton, which is not installed here: skipped.")
else:
    t0 = time.perf_counter()
    out_triton = triton_paged.paged_attention(q, k_cache, v_cache, meta, dim ** -0.5)
    seconds = time.perf_counter() - t0
    out_ref = reference.paged_attention(q, k_cache, v_cache, meta, dim ** -0.5)
    err = ((out_triton - out_ref).abs().max() / out_ref.abs().max()).item()
    print("Triton kernel equals the reference (relative error < 1e-4):", err < 1e-4)

# %%
if triton_paged is not None:
    print(f"max relative error {err:.1e}; the kernel took {seconds:.2f} s "
          f"({'interpreted on the CPU' if triton_paged.interpreting() else 'compiled, on the GPU'})")

# %%
# NBVAL_CHECK_OUTPUT
# What the kernel really computes for this step: each program takes BLOCK_Q tokens of one
# sequence and walks its keys in tiles of TILE_N, masking what lies past a token's position.
if triton_paged is None:
    sentence = "The kernel's tiles need Triton, which is not installed here: skipped."
else:
    cfg = triton_paged.launch_config(len(q), len(meta.context_lens), q_heads // kv_heads, dim, q.element_size())
    block_q, tile_n = cfg["BLOCK_Q"], cfg["TILE_N"]
    tiled = 0
    for num_new, ctx in zip(meta.cu_seqlens_q.diff().tolist(), meta.context_lens.tolist()):
        for first in range(0, num_new, block_q):  # one program's query block
            last_position = ctx - num_new + min(first + block_q, num_new) - 1
            tiled += block_q * -(-(last_position + 1) // tile_n) * tile_n
    counts = widgets.mask_counts(step)
    sentence = (f"Ragged is not free of waste inside a sequence: the kernel works in tiles of {block_q} query "
                f"tokens x {tile_n} keys here and masks what falls outside, so for this step it computes "
                f"**{tiled:,}** scores per head ({tiled / counts['needed']:.1f}x the {counts['needed']:,} needed), "
                f"still **{counts['padded'] / tiled:.1f}x** fewer than the padded layout. What ragged removes is "
                f"the padding *between* sequences: no sequence computes, or reads, another one's length — and for "
                f"decodes the read is what costs (lesson 1).")
say(sentence)

# %%
# NBVAL_CHECK_OUTPUT
if triton_paged is None:
    sentence = "Splitting needs the Triton kernel, which is not installed here: skipped."
else:
    seqs, context, q_heads_8b, kv_heads_8b, dim_8b = 8, 4096, 32, 8, 128  # Llama-3-8B's attention shape
    few_long = AttentionMetadata(cu_seqlens_q=torch.arange(seqs + 1, dtype=torch.int32),
                                 context_lens=torch.full((seqs,), context, dtype=torch.int32),
                                 block_tables=torch.zeros(seqs, context // 16, dtype=torch.int32),
                                 slot_mapping=torch.zeros(seqs, dtype=torch.int64))
    cache_shape_only = torch.empty(1, 16, kv_heads_8b, dim_8b, dtype=torch.float16)  # blocks of 16 slots
    segments = triton_paged.split_kv_segments(torch.empty(seqs, q_heads_8b, dim_8b, dtype=torch.float16),
                                              cache_shape_only, few_long)
    sentence = (f"{seqs} decodes with {context:,}-token contexts on a Llama-3-8B-shaped layer ({q_heads_8b} query "
                f"heads, {kv_heads_8b} KV heads) make {seqs * kv_heads_8b} programs; for "
                f"{triton_paged.NOMINAL_SM_COUNT} SMs (an H100's count, which the interpreter assumes) the kernel "
                f"splits each context into **{segments}** segments of {context // segments:,} keys: "
                f"{seqs * kv_heads_8b * segments} programs, then a merge.")
say(sentence)

# %% [markdown]
# The whole engine runs with it too: `attention_backend="triton"`. A batch should compute
# each sequence's attention as if it ran alone, up to rounding, and so should the kernel:
# here, in fp32, greedy tokens match. (In bf16, a different batch can change the
# rounding enough to flip a near-tie between two tokens; vLLM documents this and offers
# a slower batch-invariant mode.)

# %%
# NBVAL_CHECK_OUTPUT
if triton_paged is None:
    print("The engine's Triton backend needs Triton, which is not installed here: skipped.")
else:
    small = make_workload("uniform", num_requests=3, seed=1, max_model_len=64)
    for s in small:
        s.prompt_ids, s.max_tokens = s.prompt_ids[:12], 4
    outs = {}
    for backend in ("reference", "triton"):
        t = run_workload(small, policy="chunked", max_num_batched_tokens=16, attention_backend=backend,
                         max_model_len=64, sampling={"ignore_eos": True})
        outs[backend] = {r.request_id: r.output_ids for r in t.requests}
    print("same greedy tokens with the Triton kernel as with the reference:", outs["triton"] == outs["reference"])

# %% [markdown]
# ## 5. On a GPU
#
# `bench/gpu_attention.py` checks and times the compiled kernel on a CUDA GPU (decode
# bandwidth against a device-to-device copy, prefill TFLOP/s against PyTorch's
# FlashAttention backend) and writes `bench/results/gpu_attention.json`. If it has been
# run, its table is shown here:

# %%
results = ROOT / "bench" / "results" / "gpu_attention.txt"
print(results.read_text() if results.exists() else
      "No GPU results in bench/results/ yet: run `python bench/gpu_attention.py` on a CUDA machine.")

# %% [markdown]
# **What to remember.** A serving engine's step is ragged. Flattening it and describing it
# with `cu_seqlens_q`, `context_lens`, `block_tables` and `slot_mapping` lets one kernel
# launch serve prompt chunks and decodes of any lengths, reading K/V straight out of the
# paged cache, with no padding between sequences (only each piece's rounding to tiles).
# When a decode step has too few sequences to fill the GPU, the same kernel splits their
# contexts into segments and a second one merges them (flash-decoding).
#
# **Exercise 5** (`exercises/05_triton_kernel.ipynb`): flash-decoding's merge, by hand:
# attention over one segment, then the exact merge of segments.
