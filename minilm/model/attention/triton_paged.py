"""Triton attention for a ragged batch of prompt chunks and decode tokens over the paged KV cache.

This computes exactly what `reference.py` computes, in the way vLLM's and SGLang's
Triton backends do it (lesson 5): no padding, no dense mask, one launch for the
whole step.

The batch
    `q [T, Hq, D]` holds every new token of the step, sequence after sequence.
    Sequence i owns rows `cu_seqlens_q[i] : cu_seqlens_q[i+1]` (its `query_len`
    new tokens) and attends to `context_lens[i]` keys: everything cached before
    this step plus its own new tokens, which `write_kv` has already stored.
    Its keys live in the paged cache `[num_blocks, block_size, Hkv, D]`; key
    position p is in block `block_tables[i, p // block_size]`, slot
    `p % block_size`.

What one program computes (grid = (query blocks, KV heads))
    A *query block* is up to BLOCK_Q consecutive new tokens of ONE sequence.
    One program takes one query block and one KV head, and computes the output
    of those tokens for every query head that shares this KV head
    (grouped-query attention: GROUP = Hq // Hkv heads). So its tile of queries
    has BLOCK_Q * GROUP rows, row r = (token r // GROUP, head r % GROUP): every
    K/V tile it loads serves all of them. It then walks the sequence's keys in
    tiles of TILE_N positions, through the block table, and keeps
    FlashAttention's running softmax (max `m`, sum `l`, weighted sum of values
    `acc`, all fp32), so the [rows x context] score matrix never exists.

Every (token, head) belongs to exactly one program
    The tile has BLOCK_M rows, a power of two (block shapes must be), and
    BLOCK_Q = BLOCK_M // GROUP. With GROUP = 3, 5, 6 or 7, BLOCK_Q * GROUP <
    BLOCK_M: the last BLOCK_M % GROUP rows would name the next query block's
    first token, which the next program owns. Those rows, and rows past the
    sequence's last token, are masked out (`row_ok` in `_program_rows`): never
    loaded, never stored. A GPU runs programs in no fixed order, so a row that
    two programs wrote would take whichever value landed last.

How a program finds its sequence
    Sequence i gets the program ids starting at `cu_seqlens_q[i] // BLOCK_Q + i`.
    That start grows with i, and leaves room for every query block of sequence i
    (its `query_len` tokens need at most `query_len // BLOCK_Q + 1` blocks), so
    a binary search for the last sequence whose start is <= program id finds the
    program's sequence without any table built on the host. The grid has
    `T // BLOCK_Q + B` query blocks, enough for every sequence; programs left
    over (a short sequence needs fewer blocks than it was given) exit at once.

Where the causal mask comes from
    The new tokens are the LAST `query_len` positions of the context, so new
    token j (0-based within this step) sits at absolute position
    `context_len - query_len + j` and may see key positions up to and including
    it:  `kv_pos < context_len - query_len + j + 1`. One rule covers a whole
    prompt (nothing cached), a chunk continuing an earlier prefill (it sees all
    of the earlier chunks and the earlier tokens of its own), and a decode token
    (query_len = 1: it sees everything). Tiles that every row of the program
    may see fully are run without the mask; only the tiles on the diagonal pay
    for it.

Split-KV (flash-decoding)
    A decode step of a few sequences gives the grid only B * Hkv programs, each
    walking a long context alone, while most of the GPU's SMs sit idle. Then
    `attention_split_kv` also cuts each sequence's context into NUM_SEGMENTS
    segments, one program each; every program writes its segment's partial
    max, sum and unnormalised output, and a small second kernel merges them
    exactly (the same rescaling as the online softmax, done once across
    segments).

Rules this file keeps so that what the CPU interpreter checks is what a GPU
compiles: every `tl.dot` dimension is >= 16, every block shape is a power of two,
every `tl.arange` bound is a compile-time constant.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ..llama import AttentionMetadata

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the GPU's native instruction
MAX_SEGMENTS = 16  # split-KV: at most this many segments per sequence
NOMINAL_SM_COUNT = 132  # the interpreter has no SMs: take an H100/H200's decisions


# ---------------------------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _find_sequence(cu_seqlens_q_ptr, num_seqs, program_id, BLOCK_Q: tl.constexpr):
    """Binary search: the last sequence i with `cu_seqlens_q[i] // BLOCK_Q + i <= program_id`."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if first_block <= program_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _program_rows(
    cu_seqlens_q_ptr,
    num_seqs,
    q_block,
    kv_head,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """The (token, query head) of each of a program's BLOCK_M rows; see "What one program computes".

    Returns the program's sequence, that sequence's first row in the flat batch
    (`q_start`) and `query_len`, the program's query block within the sequence, and
    per row: `query_pos` (token index within this step's chunk), `head` (query head)
    and `row_ok`: whether the row is this program's to compute and store. Exactly one
    program in the grid has `row_ok` for each (token, head) of the batch.
    """
    seq = _find_sequence(cu_seqlens_q_ptr, num_seqs, q_block, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    offs_m = tl.arange(0, BLOCK_M)
    query_pos = local_block * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    # Rows past BLOCK_Q * GROUP are padding up to the power of two BLOCK_M: they would be
    # the next query block's first token, which belongs to the next program.
    row_ok = (offs_m < BLOCK_Q * GROUP) & (query_pos < query_len)
    return seq, q_start, query_len, local_block, query_pos, head, row_ok


@triton.jit
def _key_tiles(
    cached_len,
    query_len,
    context_len,
    local_block,
    segment,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """The key tiles a program walks: `[lo, hi)`, of which `[lo, full)` every row sees whole.

    Tiles [0, full) end at or before the block's first token; [full, last) reach its
    last token (the diagonal). With split-KV, `segment` only takes its share of them.
    """
    first_row_pos = cached_len + local_block * BLOCK_Q
    last_row_pos = cached_len + tl.minimum(local_block * BLOCK_Q + BLOCK_Q, query_len) - 1
    full = (first_row_pos + 1) // TILE_N
    last = tl.cdiv(last_row_pos + 1, TILE_N)
    lo = 0
    hi = last
    if NUM_SEGMENTS > 1:  # split-KV: this program only does its segment of the tiles
        tiles_per_segment = tl.cdiv(tl.cdiv(context_len, TILE_N), NUM_SEGMENTS)
        lo = segment * tiles_per_segment
        hi = tl.minimum(lo + tiles_per_segment, last)
    return lo, full, hi


@triton.jit
def _attend_tiles(
    acc,
    l_i,
    m_i,
    q,
    tile_lo,
    tile_hi,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    kv_head,
    stride_cb,
    stride_cs,
    stride_ch,
    context_len,
    query_pos_abs,
    qk_scale,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online softmax over key tiles [tile_lo, tile_hi) of one sequence.

    acc [BLOCK_M, D], l_i and m_i [BLOCK_M] are the running (unnormalised) output,
    sum of exponentials and maximum score of each query row, in log2 units.
    MASKED=False is for tiles every row may fully see (no compare, no select).
    """
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    for tile in range(tile_lo, tile_hi):
        kv_pos = tile * TILE_N + offs_n  # [TILE_N] absolute key positions
        kv_ok = kv_pos < context_len
        # The paged cache: position -> (block from the block table, slot inside the block).
        block = tl.load(block_table_ptr + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0).to(tl.int64)
        kv_off = block * stride_cb + (kv_pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        # K is loaded transposed, [D, TILE_N], ready for q @ k.
        k = tl.load(
            k_cache_ptr + kv_off[None, :] + offs_d[:, None],
            mask=kv_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_cache_ptr + kv_off[:, None] + offs_d[None, :],
            mask=kv_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        # qk_scale = scale * log2(e), so exp2(s) below is exp(scale * q.k): [BLOCK_M, TILE_N].
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = (kv_pos[None, :] <= query_pos_abs[:, None]) & kv_ok[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; subtract 0 instead so that
        # exp2(-inf - -inf) never makes a NaN (its p and alpha come out 0 either way).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)  # rescales what was summed under the old maximum
        l_i = l_i * alpha + tl.sum(p, 1)
        # p goes into the tensor-core dot in V's 16-bit type; the sum stays fp32.
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    seg_out_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    block_tables_ptr,
    num_seqs,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One (query block, KV head[, context segment]) of the ragged batch; see the module docstring.

    NUM_SEGMENTS == 1: the whole context, normalised output written to `out`.
    NUM_SEGMENTS > 1 (split-KV): program_id(2) picks a segment of the context, and
    the partial max / sum / unnormalised output go to the seg_* buffers.
    """
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    # 1. Which sequence, which of its query blocks, and which (token, head) each row is:
    #    BLOCK_Q tokens x GROUP query heads of this KV head.
    seq, q_start, query_len, local_block, query_pos, head, row_ok = _program_rows(
        cu_seqlens_q_ptr, num_seqs, q_block, kv_head, GROUP, BLOCK_Q, BLOCK_M
    )
    if local_block * BLOCK_Q >= query_len:
        return  # a spare program: this sequence has fewer query blocks than it was given
    context_len = tl.load(context_lens_ptr + seq)
    cached_len = context_len - query_len  # keys cached before this step

    # 2. Load the rows' queries.
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    q_off = (q_start + query_pos)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    # The causal rule: token j of the chunk is at absolute position cached_len + j.
    query_pos_abs = cached_len + query_pos

    # 3. Which key tiles: [lo, full) are visible to every row (no mask needed);
    #    [full, hi) hold the diagonal, where rows see different amounts.
    lo, full, hi = _key_tiles(
        cached_len, query_len, context_len, local_block, segment, BLOCK_Q, TILE_N, NUM_SEGMENTS
    )

    # 4. The online softmax over the tiles, fp32 state.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = _attend_tiles(
        acc,
        l_i,
        m_i,
        q,
        lo,
        tl.minimum(hi, full),
        k_cache_ptr,
        v_cache_ptr,
        block_table_ptr,
        kv_head,
        stride_cb,
        stride_cs,
        stride_ch,
        context_len,
        query_pos_abs,
        qk_scale,
        BLOCK_SIZE,
        TILE_N,
        HEAD_DIM,
        HEAD_DIM_PAD,
        False,
        DOT_PRECISION,
    )
    acc, l_i, m_i = _attend_tiles(
        acc,
        l_i,
        m_i,
        q,
        tl.maximum(lo, full),
        hi,
        k_cache_ptr,
        v_cache_ptr,
        block_table_ptr,
        kv_head,
        stride_cb,
        stride_cs,
        stride_ch,
        context_len,
        query_pos_abs,
        qk_scale,
        BLOCK_SIZE,
        TILE_N,
        HEAD_DIM,
        HEAD_DIM_PAD,
        True,
        DOT_PRECISION,
    )

    # 5. Write: the finished output, or this segment's partial state.
    store_ok = row_ok[:, None] & d_ok[None, :]
    if NUM_SEGMENTS == 1:
        out = acc / l_i[:, None]
        o_off = (
            (q_start + query_pos)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        )
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=store_ok)
    else:
        # seg_* buffers are [T, Hq, NUM_SEGMENTS(, HEAD_DIM_PAD)], contiguous.
        # int64: (token, head, segment) * HEAD_DIM_PAD passes 2^31 for large batches
        row = (
            (q_start + query_pos).to(tl.int64) * (GROUP * tl.num_programs(1)) + head
        ) * NUM_SEGMENTS + segment
        tl.store(seg_max_ptr + row, m_i, mask=row_ok)
        tl.store(seg_sum_ptr + row, l_i, mask=row_ok)
        tl.store(
            seg_out_ptr + row[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc, mask=row_ok[:, None]
        )


@triton.jit
def _merge_segments_kernel(
    seg_max_ptr,
    seg_sum_ptr,
    seg_out_ptr,
    out_ptr,
    num_q_heads,
    stride_ot,
    stride_oh,
    NUM_SEGMENTS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """Split-KV, second pass: one program per (token, query head) merges its segments.

    Each segment s has max m_s, sum l_s and output o_s, all relative to its own max.
    Bring them to the common max M: weight w_s = exp2(m_s - M); then
    out = sum_s w_s o_s / sum_s w_s l_s. An empty segment has m_s = -inf: w_s = 0.
    """
    token = tl.program_id(0)
    head = tl.program_id(1)
    row = (token.to(tl.int64) * num_q_heads + head) * NUM_SEGMENTS
    offs_s = tl.arange(0, NUM_SEGMENTS)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    m_s = tl.load(seg_max_ptr + row + offs_s)
    l_s = tl.load(seg_sum_ptr + row + offs_s)
    o_s = tl.load(seg_out_ptr + (row + offs_s)[:, None] * HEAD_DIM_PAD + offs_d[None, :])
    m = tl.max(m_s, 0)
    w = tl.math.exp2(m_s - m)
    out = tl.sum(o_s * w[:, None], 0) / tl.sum(l_s * w, 0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """One program per new token: copy its K and V (all KV heads) to its cache slot."""
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return  # slot -1: a token whose K/V must not be stored
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    ok = (offs_h < NUM_KV_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]
    dst = (
        (slot // BLOCK_SIZE) * stride_cb
        + (slot % BLOCK_SIZE) * stride_cs
        + offs_h[:, None] * stride_ch
        + offs_d[None, :]
    )
    k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=ok)
    v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=ok)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=ok)


# ---------------------------------------------------------------------------------------------
# The host side: checks, launch configuration, the two paths
# ---------------------------------------------------------------------------------------------
def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1, read at `import triton`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q.dtype={q.dtype}; allowed: float16, bfloat16, float32")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"cache dtypes {k_cache.dtype}/{v_cache.dtype} must equal q.dtype={q.dtype}"
        )
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"q {tuple(q.shape)} must be [T, Hq, D] and k/v cache {tuple(k_cache.shape)} / "
            f"{tuple(v_cache.shape)} [num_blocks, block_size, Hkv, D]"
        )
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(
            f"q heads/dim {tuple(q.shape[1:])} do not fit cache heads/dim {tuple(k_cache.shape[2:])}: "
            f"Hq must be a multiple of Hkv and D must match"
        )
    if q.shape[2] > 128:
        raise ValueError(
            f"head_dim={q.shape[2]}; allowed: up to 128 (the tile sizes are set for that)"
        )
    if q.device.type == "cpu" and not interpreting():
        raise ValueError(
            "the Triton backend on CPU needs TRITON_INTERPRET=1 set before `import triton`; "
            "or use attention_backend='reference'"
        )
    if interpreting() and q.dtype == torch.bfloat16:
        raise ValueError(
            "bfloat16 gives wrong results in Triton's CPU interpreter; use float16 or float32 "
            "(bfloat16 is fine on a GPU)"
        )
    if k_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("the head_dim axis of q and of the KV cache must be contiguous")


def launch_config(
    num_tokens: int, num_seqs: int, group: int, head_dim: int, elem_bytes: int = 2
) -> dict:
    """Block sizes and warps for a step: a function of shapes known on the host (no GPU sync).

    BLOCK_M rows hold BLOCK_Q = BLOCK_M // GROUP tokens x GROUP heads (a GROUP that
    is not a power of two leaves a few rows over, masked). Decode-only steps (one token
    per sequence) use the smallest tile a tensor-core dot allows: a program holds one
    token, and decode is bound by reading the cache, not by math. Steps with prompt
    chunks take a query block about the size of an average sequence's new tokens, up
    to 128 rows: each K/V tile loaded then serves more queries (prefill is compute-bound).
    fp32 tiles are twice the bytes, so they stay smaller to fit any GPU's shared memory.
    """
    per_seq = max(1, num_tokens // max(1, num_seqs))
    block_m = min(128 if elem_bytes <= 2 else 64, max(16, triton.next_power_of_2(per_seq * group)))
    block_m = max(block_m, triton.next_power_of_2(group))  # at least one whole token
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    tile_n = 64 if head_dim_pad * elem_bytes <= 256 else 32
    # Warps and pipeline stages: sensible defaults, not yet tuned on a GPU (bench/gpu_attention.py).
    return dict(
        BLOCK_M=block_m,
        BLOCK_Q=block_m // group,
        TILE_N=tile_n,
        HEAD_DIM_PAD=head_dim_pad,
        num_warps=8 if block_m >= 128 else 4,
        num_stages=2,
    )


def attention_grid(
    num_tokens: int, num_seqs: int, num_kv_heads: int, num_segments: int, block_q: int
):
    """(query blocks, KV heads, segments): enough query blocks for every sequence (module docstring)."""
    return (num_tokens // block_q + num_seqs, num_kv_heads, num_segments)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 caches get full-precision dots (the GPU would otherwise round inputs to tf32).
    return "ieee" if dtype == torch.float32 else "tf32"


def _launch(q, k_cache, v_cache, meta, scale, out, num_segments, partials):
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = meta.context_lens.shape[0]
    group = num_q_heads // num_kv_heads
    cfg = launch_config(num_tokens, num_seqs, group, head_dim, q.element_size())
    seg_max, seg_sum, seg_out = (
        partials if partials is not None else (out, out, out)
    )  # unused when 1 segment
    grid = attention_grid(num_tokens, num_seqs, num_kv_heads, num_segments, cfg["BLOCK_Q"])
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        seg_max,
        seg_sum,
        seg_out,
        meta.cu_seqlens_q,
        meta.context_lens,
        meta.block_tables,
        num_seqs,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        meta.block_tables.stride(0),
        GROUP=group,
        BLOCK_Q=cfg["BLOCK_Q"],
        BLOCK_M=cfg["BLOCK_M"],
        TILE_N=cfg["TILE_N"],
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
        NUM_SEGMENTS=num_segments,
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return cfg


def _prepare(q, k_cache, v_cache, meta, out):
    check_inputs(q, k_cache, v_cache)
    if meta.block_tables.stride(1) != 1:
        raise ValueError("meta.block_tables must be contiguous along its block axis")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(
            f"out {tuple(out.shape)} {out.dtype} must be shaped and typed like q "
            f"{tuple(q.shape)} {q.dtype}, head_dim contiguous"
        )
    return out


def attention_unified(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One launch for any mix of prompt chunks and decode tokens; grid (query blocks, KV heads)."""
    out = _prepare(q, k_cache, v_cache, meta, out)
    if q.shape[0]:
        _launch(q, k_cache, v_cache, meta, scale, out, 1, None)
    return out


def new_partials(q: torch.Tensor, num_segments: int):
    """Split-KV scratch: per (token, query head, segment) max, sum, and output (fp32).

    A caller may allocate these once and pass them to every layer's call."""
    t, h, d = q.shape
    d_pad = max(16, triton.next_power_of_2(d))
    f32 = dict(dtype=torch.float32, device=q.device)
    return (
        torch.empty(t, h, num_segments, **f32),
        torch.empty(t, h, num_segments, **f32),
        torch.empty(t, h, num_segments, d_pad, **f32),
    )


def attention_split_kv(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    num_segments: int,
    *,
    out: torch.Tensor | None = None,
    partials=None,
) -> torch.Tensor:
    """Flash-decoding: each sequence's context in `num_segments` parallel pieces, then a merge.

    Correct for any batch; worth it for decode steps of few sequences with long contexts."""
    if num_segments < 2 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments={num_segments}; allowed: a power of two >= 2")
    out = _prepare(q, k_cache, v_cache, meta, out)
    if not q.shape[0]:
        return out
    if partials is None:
        partials = new_partials(q, num_segments)
    elif tuple(partials[2].shape[:3]) != (*q.shape[:2], num_segments):
        raise ValueError(
            f"partials for {tuple(partials[2].shape[:3])} do not fit "
            f"(tokens, heads, segments) = {(*q.shape[:2], num_segments)}"
        )
    cfg = _launch(q, k_cache, v_cache, meta, scale, out, num_segments, partials)
    _merge_segments_kernel[(q.shape[0], q.shape[1])](
        *partials,
        out,
        q.shape[1],
        out.stride(0),
        out.stride(1),
        NUM_SEGMENTS=num_segments,
        HEAD_DIM=q.shape[2],
        HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
    )
    return out


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return NOMINAL_SM_COUNT


def split_kv_segments(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> int:
    """How many segments to split each context into; 1 means "don't split".

    Split only decode steps (one token per sequence: T == B), and only when the plain
    grid of B x Hkv programs would leave the GPU short of work (fewer than two per SM).
    Then aim for about two programs per SM, but keep every segment at least two key
    tiles long, judged by the widest block table (the longest context, on the host).
    """
    num_tokens, num_seqs = q.shape[0], meta.context_lens.shape[0]
    programs = num_seqs * k_cache.shape[2]
    target = 2 * sm_count(q.device)
    if num_tokens != num_seqs or num_seqs == 0 or programs >= target:
        return 1
    tile_n = launch_config(
        num_tokens, num_seqs, q.shape[1] // k_cache.shape[2], q.shape[2], q.element_size()
    )["TILE_N"]
    longest_tiles = meta.block_tables.shape[1] * k_cache.shape[1] // tile_n
    segments = min(
        MAX_SEGMENTS, triton.next_power_of_2(math.ceil(target / programs)), longest_tiles // 2
    )
    return 1 if segments < 2 else 1 << (segments.bit_length() - 1)  # a power of two


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention for a ragged batch over the paged cache; same contract as `reference.paged_attention`."""
    segments = split_kv_segments(q, k_cache, meta)
    if segments > 1:
        return attention_split_kv(q, k_cache, v_cache, meta, scale, segments, out=out)
    return attention_unified(q, k_cache, v_cache, meta, scale, out=out)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K/V at its flat slot (block * block_size + offset); slot -1 = skip."""
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(
            f"k {tuple(k.shape)} / v {tuple(v.shape)} must be [T, Hkv, D] matching the cache "
            f"{tuple(k_cache.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping {tuple(slot_mapping.shape)} must have one slot per token ({k.shape[0]})"
        )
    if (
        k_cache.shape != v_cache.shape
        or k_cache.stride(3) != 1
        or k.stride(2) != 1
        or v.stride(2) != 1
    ):
        raise ValueError(
            "k/v and the caches must be contiguous along head_dim, caches of one shape"
        )
    if k.shape[0] == 0:
        return
    hkv, d = k.shape[1], k.shape[2]
    _write_kv_kernel[(k.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=hkv,
        HEADS_PAD=triton.next_power_of_2(hkv),
        HEAD_DIM=d,
        HEAD_DIM_PAD=triton.next_power_of_2(d),
        BLOCK_SIZE=k_cache.shape[1],
    )
