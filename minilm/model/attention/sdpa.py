"""Fast CPU attention over the paged KV cache: PyTorch's fused SDPA on gathered keys.

It computes what `reference.py` computes, up to float rounding. On a CPU the reference's
separate einsum, mask and softmax passes and its loop over sequences are most of a decode
step; here a group of sequences costs two gathers and one fused call.

The step's layout is built for its first layer and kept in `meta.scratch` for the others:
- decodes are sorted by context length and cut into groups padded by at most MAX_PADDING;
  a KV head's query heads become its query rows ([B, Hkv, group, D]), so grouped-query
  attention copies no K/V;
- each prompt or chunk is its own call: SDPA's causal mode, or an offset mask.

Positions past a context gather that sequence's last real key (masked): a slot past a
context may hold anything, even NaN (NaN * 0 is NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..llama import AttentionMetadata, cache_slots
from .reference import write_kv  # noqa: F401 (the backend's second function)

# A decode group pads every context to its longest, at most by this factor: smaller means
# less padding, but more groups (each a few ops per layer).
MAX_PADDING = 1.5


@dataclass
class DecodeGroup:
    rows: torch.Tensor  # [B] rows of q (and of the output) of the group's decode tokens
    slots: torch.Tensor  # [B * L] flat cache slot of each (sequence, key position)
    mask: torch.Tensor  # [B, 1, 1, L] 0 for a real key, -inf for padding
    length: int  # L, the group's longest context


@dataclass
class PrefillSeq:
    start: int  # rows start:end of q are this sequence's new tokens
    end: int
    slots: torch.Tensor  # [context_len] flat cache slot of each key position
    mask: torch.Tensor | None  # [n, context_len] True: a query sees a key; None: causal


def length_groups(lens: list[int]) -> list[tuple[int, int]]:
    """Cut `lens` (longest first) into ranges [a, b), none padded by more than MAX_PADDING."""
    if not lens:
        return []
    groups, a = [], 0
    for i in range(1, len(lens)):
        if lens[i] * MAX_PADDING < lens[a]:
            groups.append((a, i))
            a = i
    return groups + [(a, len(lens))]


def build_layout(
    meta: AttentionMetadata, block_size: int
) -> tuple[list[DecodeGroup], list[PrefillSeq]]:
    (cu, lens), dev = meta.host_layout(), meta.context_lens.device
    n_new = [b - a for a, b in zip(cu, cu[1:])]
    decodes = []
    seqs = sorted((i for i, n in enumerate(n_new) if n == 1), key=lambda i: -lens[i])
    if seqs:
        # all decodes' slots and masks at once, padded to the longest; each group slices them
        idx = torch.tensor(seqs, device=dev)
        ctx = meta.context_lens[idx].long()[:, None]
        pos = torch.arange(lens[seqs[0]], device=dev)[None, :]
        slots = cache_slots(
            meta.block_tables, idx[:, None], torch.minimum(pos, ctx - 1), block_size
        )
        mask = torch.zeros(slots.shape, device=dev).masked_fill(pos >= ctx, float("-inf"))
        rows = meta.cu_seqlens_q[idx].long()
        for a, b in length_groups([lens[i] for i in seqs]):
            n = lens[seqs[a]]
            group = DecodeGroup(rows[a:b], slots[a:b, :n].flatten(), mask[a:b, None, None, :n], n)
            decodes.append(group)
    prefills = []
    for i in (i for i, n in enumerate(n_new) if n > 1):
        n, c = n_new[i], lens[i]
        slots = cache_slots(meta.block_tables, i, torch.arange(c, device=dev), block_size)
        # A whole prompt is SDPA's own causal case; a chunk after earlier ones needs the offset.
        mask = None if n == c else torch.ones(n, c, dtype=torch.bool, device=dev).tril(c - n)
        prefills.append(PrefillSeq(cu[i], cu[i + 1], slots, mask))
    return decodes, prefills


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a ragged batch: q [T, Hq, D] -> [T, Hq, D], into `out` if given
    (the tests pass one full of NaN)."""
    num_blocks, block_size, hkv, d = k_cache.shape
    hq = q.shape[1]
    keys = k_cache.view(num_blocks * block_size, hkv, d)  # one row per cache slot
    values = v_cache.view(num_blocks * block_size, hkv, d)
    if "sdpa" not in meta.scratch:  # the step's first layer
        meta.scratch["sdpa"] = build_layout(meta, block_size)
    decodes, prefills = meta.scratch["sdpa"]
    out = torch.empty_like(q) if out is None else out
    for g in decodes:
        b = len(g.rows)
        # a KV head's query heads as its rows
        qg = q.index_select(0, g.rows).view(b, hkv, hq // hkv, d)
        k = keys.index_select(0, g.slots).view(b, g.length, hkv, d).transpose(1, 2).to(q.dtype)
        v = values.index_select(0, g.slots).view(b, g.length, hkv, d).transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=g.mask.to(q.dtype), scale=scale)
        out.index_copy_(0, g.rows, o.reshape(b, hq, d))
    for p in prefills:
        k = keys.index_select(0, p.slots).transpose(0, 1)[None].to(q.dtype)  # [1, Hkv, ctx, D]
        v = values.index_select(0, p.slots).transpose(0, 1)[None].to(q.dtype)
        qp = q[p.start : p.end].transpose(0, 1)[None]  # [1, Hq, n, D]
        o = F.scaled_dot_product_attention(
            qp, k, v, attn_mask=p.mask, is_causal=p.mask is None, scale=scale, enable_gqa=True
        )
        out[p.start : p.end] = o[0].transpose(0, 1)
    return out
