"""Readable pure-torch attention over the paged KV cache: the ground truth.

A step's batch is ragged: sequence i has `n_i` new query tokens (a prompt chunk, or
one decode token) and attends to `context_lens[i]` keys, every token cached before
this step plus its own new ones. Its new tokens are the *last* `n_i` positions of
that context, so query j sits at position `context_len - n_i + j` and may see keys at
positions `<=` that. This one rule covers a whole prompt, a chunk continuing an earlier
prefill, and a decode token (lesson 5).

Each sequence is computed on its own, in fp32: the simplest code that is right, which
the faster backends (sdpa.py, triton_paged.py) are tested against.
"""

from __future__ import annotations

import torch

from ..llama import AttentionMetadata


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K/V at its slot, a real one (>= 0): skipping slot -1, as
    Triton's write_kv can, would read `slot_mapping` on the host, a GPU sync a layer."""
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k.to(k_cache.dtype)  # view: never a copy
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v.to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """One sequence's keys (or values) in position order: [context_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [num_blocks, block_size, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def attend_sequence(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_len: int,
    scale: float,
) -> torch.Tensor:
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


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a ragged batch, one sequence at a time."""
    out = torch.empty_like(q)
    cu, ctx = meta.host_layout()  # Python ints: no GPU sync
    for i in range(len(ctx)):
        start, end = cu[i], cu[i + 1]
        out[start:end] = attend_sequence(
            q[start:end], k_cache, v_cache, meta.block_tables[i], ctx[i], scale
        ).to(q.dtype)
    return out
