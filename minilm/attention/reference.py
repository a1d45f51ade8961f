"""Readable pure-torch attention over the paged KV cache: the ground truth and the CPU path.

A step's batch is ragged: sequence i has `n_i` new query tokens (a prompt chunk, or
one decode token) and attends to `context_lens[i]` keys — every token cached before
this step plus its own new ones. Its new tokens are the *last* `n_i` positions of
that context, so query j (0-based within the chunk) sits at absolute position
`context_len - n_i + j` and may see keys at positions `<=` that. This one rule covers
a whole prompt (no earlier context), a chunk continuing an earlier prefill, and a
decode token (n_i = 1 sees everything). Lesson 5 walks through it.

Sequences with several queries are computed one at a time (`attend_sequence`). The
single-token decodes, usually most of a batch, are computed together
(`attend_decodes`): one gather of their blocks, padded to the longest context and
masked, in groups of similar length (`group_by_length`). Doing them one by one would cost a few Python-dispatched ops per sequence
per layer, which on a CPU is most of a decode step.
"""
from __future__ import annotations

import torch

from ..model import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each new token's K/V at its slot. Slot -1 means "do not store"."""
    num_blocks, block_size, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(num_blocks * block_size, hkv, d)[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, hkv, d)[slots] = v[keep].to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """One sequence's keys (or values) in position order: [context_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [num_blocks, block_size, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def attend_sequence(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    context_len: int, scale: float) -> torch.Tensor:
    """Causal attention of one sequence's n new queries [n, Hq, D] over its context."""
    n, num_q_heads = q.shape[0], q.shape[1]
    group = num_q_heads // k_cache.shape[2]  # grouped-query attention: query heads per KV head
    k = gather_kv(k_cache, block_table, context_len).float().repeat_interleave(group, dim=1)
    v = gather_kv(v_cache, block_table, context_len).float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale  # [H, n, ctx]
    q_pos = torch.arange(context_len - n, context_len, device=q.device)
    k_pos = torch.arange(context_len, device=q.device)
    scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def attend_decodes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                   context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Single-token queries of B sequences at once: q [B, Hq, D] -> [B, Hq, D]."""
    bsz, num_q_heads, d = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    max_blocks = (int(context_lens.max()) + block_size - 1) // block_size
    tables = block_tables[:, :max_blocks].long()
    k = k_cache[tables].reshape(bsz, -1, num_kv_heads, d).float()  # [B, L, Hkv, D], padded
    v = v_cache[tables].reshape(bsz, -1, num_kv_heads, d).float()
    qg = q.float().view(bsz, num_kv_heads, group, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    pad = torch.arange(k.shape[1], device=q.device)[None, :] >= context_lens[:, None]  # [B, L]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    v = v.masked_fill(pad[:, :, None, None], 0.0)  # slots past the context may hold anything, even NaN
    out = torch.einsum("bhgl,blhd->bhgd", scores.softmax(-1), v)
    return out.reshape(bsz, num_q_heads, d)


def group_by_length(context_lens: torch.Tensor, block_size: int) -> list[torch.Tensor]:
    """Indices of sequences whose block counts share a power-of-two bucket (1, 2, 3-4, 5-8, ...).

    Decodes padded together all pay for the longest context among them; bucketing keeps
    one long sequence from making every short one as slow as itself."""
    blocks = (context_lens + block_size - 1) // block_size
    buckets = torch.log2(blocks.clamp(min=1).float()).ceil().long()
    return [torch.nonzero(buckets == b).flatten() for b in buckets.unique().tolist()]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention for a ragged batch of prompt chunks and decode tokens; fp32 math."""
    out = torch.empty_like(q)
    cu = meta.cu_seqlens_q
    q_lens = cu[1:] - cu[:-1]
    decode = torch.nonzero(q_lens == 1).flatten()
    for group in group_by_length(meta.context_lens[decode].long(), k_cache.shape[1]):
        seqs = decode[group]
        rows = cu[seqs].long()
        out[rows] = attend_decodes(q[rows], k_cache, v_cache, meta.block_tables[seqs],
                                   meta.context_lens[seqs].long(), scale).to(q.dtype)
    cu_list, ctx_list = cu.tolist(), meta.context_lens.tolist()
    for i in torch.nonzero(q_lens > 1).flatten().tolist():
        start, end = cu_list[i], cu_list[i + 1]
        out[start:end] = attend_sequence(q[start:end], k_cache, v_cache, meta.block_tables[i],
                                         ctx_list[i], scale).to(q.dtype)
    return out
