"""The Triton paged-attention kernel against the pure-torch reference (CPU: Triton's interpreter).

Every case uses fresh random inputs, a scrambled block table (shuffled blocks, random
ids in the unused tail) and a cache that is random everywhere, so reading a wrong
slot changes the answer; outputs are poisoned with NaN first, so an element the
kernel forgot to write fails. The shapes obey the GPU's rules (see triton_paged.py),
and the launch configuration is the one a GPU gets for the same batch; the last test
compiles the kernels for an H100/H200 with Triton's GPU compiler, no GPU needed.

A GPU runs a launch's programs in no fixed order, the interpreter in one (first to
last), so a kernel in which two programs write the same element passes here whenever
the later program writes the right value. Two kinds of test close that gap: a
coverage kernel that runs the attention kernel's own row and key-tile mapping and
counts what each (token, head) gets, which must be exactly once; and reference checks,
on shapes where query blocks end on key-tile boundaries, run with the grid walked in
order and in reverse (the `grid_order` fixture).
"""

from __future__ import annotations

import builtins
import random
import types
from functools import partial

import pytest
import torch

triton = pytest.importorskip(
    "triton", reason="Triton is not installed here (it has wheels for Linux only)"
)
import triton.language as tl  # noqa: E402
from helpers import paged_attention_batch  # noqa: E402

from minilm import Engine, EngineConfig
from minilm.model.attention import reference, triton_paged
from minilm.model.attention.triton_paged import _key_tiles, _program_rows

TOL = {torch.float32: 1e-3, torch.float16: 1e-2}

# (new tokens per sequence, context length per sequence: cached + new)
DECODE = ([1, 1, 1, 1], [1, 17, 64, 130])  # incl. a single-token context
PREFILL = ([1, 20, 37], [1, 20, 37])  # whole prompts, lengths not multiples of 16
MIXED = ([1, 24, 0, 13, 1, 40], [90, 24, 5, 61, 33, 40])  # decodes, a prompt, a chunk continuing
# a prefill (48 cached + 13), an idle sequence
LONG = ([1, 20, 1], [700, 820, 1000])  # long contexts: many tiles and blocks


# random numbers everywhere: reading a wrong slot changes the answer
make_batch = partial(paged_attention_batch, nan_outside_context=False)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest output magnitude."""
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def check(out, q, k_cache, v_cache, meta, scale):
    ref = reference.paged_attention(q, k_cache, v_cache, meta, scale)
    assert torch.isfinite(out).all(), "some output element was never written (NaN poison left)"
    err = rel_error(out, ref)
    assert err < TOL[q.dtype], f"relative error {err:.2e} >= {TOL[q.dtype]:.0e} ({q.dtype})"
    return err


def poisoned(q):
    return torch.full_like(q, float("nan"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "case,block_size",
    [(MIXED, 16), (DECODE, 16), (PREFILL, 32)],
    ids=["mixed", "decode", "prefill"],
)
def test_unified_matches_reference(case, block_size, group, head_dim, dtype):
    q, kc, vc, meta = make_batch(
        *case, group, head_dim, dtype, block_size=block_size, seed=group * head_dim
    )
    out = triton_paged.attention_unified(q, kc, vc, meta, head_dim**-0.5, out=poisoned(q))
    check(out, q, kc, vc, meta, head_dim**-0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_long_contexts(dtype):
    q, kc, vc, meta = make_batch(*LONG, group=4, head_dim=64, dtype=dtype, block_size=16, seed=1)
    out = triton_paged.attention_unified(q, kc, vc, meta, 0.125, out=poisoned(q))
    check(out, q, kc, vc, meta, 0.125)


def test_block_size_not_a_power_of_two():
    # The kernel maps each key position to (block, slot) itself, so any block size works.
    q, kc, vc, meta = make_batch(
        *MIXED, group=2, head_dim=32, dtype=torch.float32, block_size=12, seed=2
    )
    check(
        triton_paged.attention_unified(q, kc, vc, meta, 0.2, out=poisoned(q)), q, kc, vc, meta, 0.2
    )


@pytest.mark.parametrize("segments", [2, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_split_kv_matches_reference(segments, dtype):
    # Contexts from 3 tokens (most of its 16 segments are empty) to 700.
    q, kc, vc, meta = make_batch(
        [1, 1, 1], [3, 200, 700], group=4, head_dim=32, dtype=dtype, seed=segments
    )
    partials = tuple(
        torch.full_like(p, float("nan")) for p in triton_paged.new_partials(q, segments)
    )
    out = triton_paged.attention_split_kv(
        q, kc, vc, meta, 0.2, segments, out=poisoned(q), partials=partials
    )
    check(out, q, kc, vc, meta, 0.2)


def test_split_kv_is_exact_for_prompt_chunks_too():
    # The dispatcher only splits decode steps, but the split path is correct for any batch.
    q, kc, vc, meta = make_batch(
        [1, 6, 3], [40, 70, 3], group=2, head_dim=32, dtype=torch.float32, seed=3
    )
    check(
        triton_paged.attention_split_kv(q, kc, vc, meta, 0.2, 4, out=poisoned(q)),
        q,
        kc,
        vc,
        meta,
        0.2,
    )


def test_dispatcher_splits_only_few_long_decodes():
    few_long = make_batch([1, 1], [600, 900], group=4, head_dim=32, dtype=torch.float32, seed=4)
    q, kc, vc, meta = few_long
    segments = triton_paged.split_kv_segments(q, kc, meta)
    assert segments > 1
    check(triton_paged.paged_attention(q, kc, vc, meta, 0.2, out=poisoned(q)), q, kc, vc, meta, 0.2)
    short = make_batch([1, 1], [20, 30], group=4, head_dim=32, dtype=torch.float32)
    assert triton_paged.split_kv_segments(short[0], short[1], short[3]) == 1
    prefill = make_batch([1, 9], [600, 900], group=4, head_dim=32, dtype=torch.float32)
    assert triton_paged.split_kv_segments(prefill[0], prefill[1], prefill[3]) == 1
    many = make_batch([1] * 200, [64] * 200, group=1, head_dim=32, dtype=torch.float32)
    assert triton_paged.split_kv_segments(many[0], many[1], many[3]) == 1


# ---------------------------------------------------------------------------------------------
# Every (token, head) computed exactly once, whatever order the programs run in
# ---------------------------------------------------------------------------------------------
@triton.jit
def _record_program_order(next_slot_ptr, order_ptr):
    """Each program appends its linear id to `order`: the order the grid was walked in."""
    pid = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(
        2
    ) + tl.program_id(2)
    slot = tl.atomic_add(next_slot_ptr, 1)
    tl.store(order_ptr + slot, pid)


def program_order(grid=(3, 2, 2)) -> list[int]:
    next_slot = torch.zeros(1, dtype=torch.int32)
    order = torch.full((grid[0] * grid[1] * grid[2],), -1, dtype=torch.int32)
    _record_program_order[grid](next_slot, order)
    return order.tolist()


def reverse_grid_walk(monkeypatch) -> None:
    """Make Triton's interpreter run every launch's programs last to first (a legal GPU schedule).

    The interpreter walks the grid in `GridExecutor.__call__` with three nested
    `for x in range(grid[0])` loops (triton/runtime/interpreter.py). That is a private
    detail: if it has moved, the reversed cases skip, saying so. The patch rebinds
    `range` for that one function only (a copy of it whose globals map `range` to a
    reversed range), then checks on a tiny kernel that the order really is reversed.
    """
    from triton.runtime import interpreter

    call = (
        getattr(interpreter, "GridExecutor", None).__call__
        if hasattr(interpreter, "GridExecutor")
        else None
    )
    code = getattr(call, "__code__", None)
    if code is None or not {"range", "set_grid_idx"} <= set(code.co_names):
        pytest.skip(
            "cannot reverse the grid: triton.runtime.interpreter.GridExecutor.__call__ no longer "
            "walks the grid with `range` (a private detail of Triton's interpreter has moved)"
        )
    reversed_globals = dict(call.__globals__, range=lambda *args: builtins.range(*args)[::-1])
    walk_reversed = types.FunctionType(
        code, reversed_globals, call.__name__, call.__defaults__, call.__closure__
    )
    walk_reversed.__kwdefaults__ = call.__kwdefaults__
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", walk_reversed)
    order = program_order()
    if order != sorted(order, reverse=True):
        pytest.skip(
            f"cannot reverse the grid: rebinding `range` in Triton's interpreter walked programs "
            f"{order} (a private detail of triton/runtime/interpreter.py has moved)"
        )


@pytest.fixture(params=["in_order", "reversed"])
def grid_order(request, monkeypatch):
    """Run the test's Triton launches with their programs in order, and again in reverse."""
    if request.param == "reversed":
        if not triton_paged.interpreting():
            pytest.skip(
                "the grid is reversed in Triton's CPU interpreter only; a GPU picks its own order"
            )
        reverse_grid_walk(monkeypatch)
    return request.param


def test_grid_order_fixture_reverses_the_program_order(grid_order):
    if not triton_paged.interpreting():
        pytest.skip("program order is only deterministic in Triton's CPU interpreter")
    in_order = list(range(12))
    assert program_order() == (in_order if grid_order == "in_order" else in_order[::-1])


@triton.jit
def _count_rows_kernel(
    cu_seqlens_q_ptr,
    context_lens_ptr,
    num_seqs,
    writes_ptr,
    tiles_ptr,
    unmasked_ptr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    MAX_TILES: tl.constexpr,
):
    """The attention kernel's programs, counting instead of computing, with its own helpers.

    writes[token, head, segment] += 1 for every row a program stores;
    tiles[token, head, tile] += 1 for every key tile a program walks for that row;
    unmasked[token, head, tile] += 1 for those it walks without the causal mask.
    """
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    seq, q_start, query_len, local_block, query_pos, head, row_ok = _program_rows(
        cu_seqlens_q_ptr, num_seqs, q_block, kv_head, GROUP, BLOCK_Q, BLOCK_M
    )
    context_len = tl.load(context_lens_ptr + seq)
    lo, full, hi = _key_tiles(
        context_len - query_len,
        query_len,
        context_len,
        local_block,
        segment,
        BLOCK_Q,
        TILE_N,
        NUM_SEGMENTS,
    )
    row = tl.where(row_ok, (q_start + query_pos) * (GROUP * tl.num_programs(1)) + head, 0)
    tl.atomic_add(writes_ptr + row * NUM_SEGMENTS + segment, 1, mask=row_ok)
    tile = tl.arange(0, MAX_TILES)
    walked = row_ok[:, None] & (tile >= lo)[None, :] & (tile < hi)[None, :]
    tl.atomic_add(tiles_ptr + row[:, None] * MAX_TILES + tile[None, :], 1, mask=walked)
    tl.atomic_add(
        unmasked_ptr + row[:, None] * MAX_TILES + tile[None, :],
        1,
        mask=walked & (tile < full)[None, :],
    )


BLOCK_MS = (16, 32, 64, 128)  # every BLOCK_M launch_config can choose (checked below)
TILE_NS = (32, 64)


def test_launch_config_chooses_only_the_covered_configurations():
    seen = set()
    for group in range(1, 9):
        for head_dim in (32, 64, 128):
            for elem_bytes in (2, 4):
                for tokens, seqs in [
                    (1, 1),
                    (8, 8),
                    (300, 300),
                    (40, 4),
                    (100, 3),
                    (4096, 1),
                    (37, 5),
                ]:
                    cfg = triton_paged.launch_config(tokens, seqs, group, head_dim, elem_bytes)
                    assert cfg["BLOCK_M"] in BLOCK_MS and cfg["TILE_N"] in TILE_NS, cfg
                    assert cfg["BLOCK_Q"] == cfg["BLOCK_M"] // group >= 1, cfg
                    seen.add(cfg["BLOCK_M"])
    assert seen == set(BLOCK_MS)


def ragged_batch(rng: random.Random, block_q: int, tile_n: int):
    """Prompt chunks, decodes and idle sequences; chunk lengths on and just off multiples of
    BLOCK_Q, cached lengths that make a query block end on, or one off, a key-tile boundary."""
    q_lens, ctx_lens = [], []
    for i in range(rng.randint(2, 5)):
        n = rng.choice(
            [block_q + 1, 2 * block_q, 2 * block_q + 1]
        )  # the first spans several blocks
        if i:
            n = rng.choice([0, 1, 1, 1, block_q - 1, block_q, n, rng.randint(2, 3 * block_q)])
        k = rng.randint(
            1, max(1, (n - 1) // block_q)
        )  # cached + k * BLOCK_Q on a tile boundary: block
        on_tile = (-k * block_q) % tile_n + tile_n * rng.randint(
            0, 1
        )  # k-1 ends there, and the chunk goes on
        cached = rng.choice(
            [0, on_tile, on_tile, on_tile + 1, max(0, on_tile - 1), rng.randint(0, 3 * tile_n)]
        )
        q_lens.append(max(n, 0))
        ctx_lens.append(cached + max(n, 0))
    if not sum(q_lens):  # a step has at least one new token (the host skips empty launches)
        q_lens[-1], ctx_lens[-1] = 1, ctx_lens[-1] + 1
    return q_lens, ctx_lens


def count_rows(q_lens, ctx_lens, group, num_kv_heads, block_m, tile_n, segments):
    """Launch the counting kernel on the grid the attention kernel gets; (writes, tiles, unmasked)."""
    block_q = block_m // group
    num_tokens, num_seqs, num_q_heads = sum(q_lens), len(q_lens), group * num_kv_heads
    max_tiles = triton.next_power_of_2(max(-(-c // tile_n) for c in ctx_lens) + 1)
    writes = torch.zeros(num_tokens, num_q_heads, segments, dtype=torch.int32)
    tiles = torch.zeros(num_tokens, num_q_heads, max_tiles, dtype=torch.int32)
    unmasked = torch.zeros_like(tiles)
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    grid = triton_paged.attention_grid(num_tokens, num_seqs, num_kv_heads, segments, block_q)
    _count_rows_kernel[grid](
        cu,
        torch.tensor(ctx_lens, dtype=torch.int32),
        num_seqs,
        writes,
        tiles,
        unmasked,
        GROUP=group,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        TILE_N=tile_n,
        NUM_SEGMENTS=segments,
        MAX_TILES=max_tiles,
    )
    return writes, tiles, unmasked


@pytest.mark.parametrize("group", range(1, 9))
def test_every_row_is_written_once_and_sees_its_key_tiles_once(group):
    """For every BLOCK_M the launch can use, over random ragged batches: each (token, head,
    segment) is stored by exactly one program, and each (token, head) is given every key
    tile up to its own position exactly once (across the segments, if split), and none
    past it without the causal mask."""
    rng = random.Random(group)
    for i, block_m in enumerate(BLOCK_MS):
        block_q = block_m // group
        # One batch per (group, BLOCK_M), alternating between 2 KV heads with TILE_N=64, and
        # split-KV (2 or 4 segments) with TILE_N=32: every group and every BLOCK_M meets both.
        split = (group + i) % 2 == 0
        tile_n, segments, num_kv_heads = (32, (2, 4)[group // 2 % 2], 1) if split else (64, 1, 2)
        q_lens, ctx_lens = ragged_batch(rng, block_q, tile_n)
        writes, tiles, unmasked = count_rows(
            q_lens, ctx_lens, group, num_kv_heads, block_m, tile_n, segments
        )
        where = (
            f"group={group} BLOCK_M={block_m} BLOCK_Q={block_q} TILE_N={tile_n} segments={segments} "
            f"Hkv={num_kv_heads} q_lens={q_lens} ctx_lens={ctx_lens}"
        )
        bad = (writes != 1).nonzero().tolist()
        assert not bad, (
            f"{len(bad)} (token, head, segment) written {sorted(set(writes.flatten().tolist()))} "
            f"times, not once, e.g. {bad[:4]}; {where}"
        )
        twice = (tiles > 1).nonzero().tolist()
        assert not twice, (
            f"{len(twice)} (token, head, key tile) walked twice, e.g. {twice[:4]}; {where}"
        )
        # Every key tile up to and including the one holding the token's own position; without
        # the mask, only tiles that end at or before it.
        positions = torch.cat([torch.arange(c - n, c) for n, c in zip(q_lens, ctx_lens)])[:, None]
        tile = torch.arange(tiles.shape[2])[None, :]
        needed = tile <= positions // tile_n  # [T, tiles]
        missing = ((tiles == 0) & needed[:, None, :]).nonzero().tolist()
        assert not missing, (
            f"{len(missing)} (token, head, key tile) that the row must see never walked, "
            f"e.g. {missing[:4]}; {where}"
        )
        past = (tile + 1) * tile_n > positions + 1  # the tile holds keys after the token
        peeked = ((unmasked > 0) & past[:, None, :]).nonzero().tolist()
        assert not peeked, (
            f"{len(peeked)} (token, head, key tile) walked without the causal mask, yet holding "
            f"keys after the token, e.g. {peeked[:4]}; {where}"
        )


# Query blocks that end exactly on a key-tile boundary: a block's tiles then stop right
# before the next block's first key, so any row computed by the wrong program is wrong.
CHUNKS = [40, 1, 17, 1, 26]  # prompt chunks among decodes: BLOCK_M 32-128
DECODE_HEAVY = [1, 1, 1, 1, 1, 1, 20, 13]  # mostly decodes: BLOCK_M 16-32, BLOCK_Q 4-16
SPLIT = [18, 1]  # few tokens: the merge runs one program per (token, head)


def tile_boundary_batch(q_lens, group, head_dim, dtype, num_kv_heads, seed):
    """make_batch, with each chunk longer than BLOCK_Q given the cached length that makes one of
    its query blocks (not the last) end exactly on a key-tile boundary."""
    cfg = triton_paged.launch_config(sum(q_lens), len(q_lens), group, head_dim, dtype.itemsize)
    block_q, tile_n = cfg["BLOCK_Q"], cfg["TILE_N"]
    rng = random.Random(seed)
    ctx_lens = []
    for i, n in enumerate(q_lens):
        if (
            n > block_q
        ):  # blocks 0..k-1 end at cached + k * BLOCK_Q, a multiple of TILE_N; the chunk goes on
            k = 1 + i % ((n - 1) // block_q)
            cached = (-k * block_q) % tile_n + tile_n * (i % 2)
        else:
            cached = rng.randint(0, 3 * tile_n)
        ctx_lens.append(cached + n)
    assert any(n > block_q for n in q_lens), (
        f"no query block ends inside a chunk (BLOCK_Q={block_q})"
    )
    return make_batch(
        q_lens, ctx_lens, group, head_dim, dtype, num_kv_heads=num_kv_heads, seed=seed
    )


def gqa_shape(group):
    """Groups 1-8 with 1-2 KV heads and head_dim 32 or 64, as num_q_heads = group * num_kv_heads."""
    return dict(head_dim=32 if group % 2 else 64, num_kv_heads=2 if group <= 4 else 1)


@pytest.mark.parametrize(
    "q_lens,dtype,group",
    [(CHUNKS, torch.float32, g) for g in range(1, 9)]
    + [(DECODE_HEAVY, torch.float32, g) for g in range(1, 9)]
    + [(CHUNKS, torch.float16, g) for g in (3, 5, 6, 7)],  # fp16: the groups with spare rows
    ids=[
        f"{name}-{g}"
        for name, groups in [
            ("chunks-fp32", range(1, 9)),
            ("decodes-fp32", range(1, 9)),
            ("chunks-fp16", (3, 5, 6, 7)),
        ]
        for g in groups
    ],
)
def test_unified_any_group_any_program_order(q_lens, dtype, group, grid_order):
    shape = gqa_shape(group)
    q, kc, vc, meta = tile_boundary_batch(
        q_lens, group, shape["head_dim"], dtype, shape["num_kv_heads"], seed=10 + group
    )
    scale = shape["head_dim"] ** -0.5
    check(
        triton_paged.attention_unified(q, kc, vc, meta, scale, out=poisoned(q)),
        q,
        kc,
        vc,
        meta,
        scale,
    )


@pytest.mark.parametrize("group", range(1, 9))
def test_split_kv_any_group_any_program_order(group, grid_order):
    # One KV head and 2 segments keep the interpreter's program count (and time) down.
    q, kc, vc, meta = tile_boundary_batch(
        SPLIT, group, 32, torch.float32, num_kv_heads=1, seed=20 + group
    )
    partials = tuple(torch.full_like(p, float("nan")) for p in triton_paged.new_partials(q, 2))
    out = triton_paged.attention_split_kv(
        q, kc, vc, meta, 0.2, 2, out=poisoned(q), partials=partials
    )
    check(out, q, kc, vc, meta, 0.2)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_write_kv_matches_reference(cache_dtype):
    gen = torch.Generator().manual_seed(5)
    num_blocks, block_size, hkv, d, t = 6, 16, 2, 32, 11
    k, v = torch.randn(t, hkv, d, generator=gen), torch.randn(t, hkv, d, generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t]
    slots[[2, 7]] = -1  # -1: do not store (e.g. padding)
    caches = [
        torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(cache_dtype) for _ in range(2)
    ]
    expected = [c.clone() for c in caches]
    keep = slots >= 0  # the reference stores every token it is given: give it only the kept ones
    reference.write_kv(k[keep], v[keep], *expected, slots[keep])
    triton_paged.write_kv(k, v, *caches, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_bad_inputs_raise_value_error():
    q, kc, vc, meta = make_batch(*DECODE, group=2, head_dim=32, dtype=torch.float32)
    with pytest.raises(ValueError, match="bfloat16"):
        triton_paged.paged_attention(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), meta, 0.2)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        triton_paged.paged_attention(q[:, :3], kc, vc, meta, 0.2)
    with pytest.raises(ValueError, match="num_segments"):
        triton_paged.attention_split_kv(q, kc, vc, meta, 0.2, 3)


def test_engine_greedy_tokens_match_reference():
    """A short mixed workload (chunked prefill: chunks continuing earlier ones next to decodes)."""
    prompts = {"a": list(range(3, 40)), "b": [7, 8, 9], "c": list(range(100, 121)), "d": [5] * 50}

    def run(backend):
        engine = Engine(
            "tiny",
            EngineConfig(
                policy="chunked",
                attention_backend=backend,
                max_num_seqs=4,
                max_num_batched_tokens=24,
                max_model_len=128,
            ),
        )
        for rid, ids in prompts.items():
            engine.add_request(rid, ids, max_tokens=5, ignore_eos=True)
        timeline = engine.run()
        kinds = {item.kind for step in timeline.steps for item in step.items}
        return {r.request_id: r.output_ids for r in timeline.requests}, kinds

    expected, kinds = run("reference")
    assert {"prefill", "decode"} <= kinds
    got, _ = run("triton")
    assert got == expected


# Compiled for an H100/H200 (sm_90) by Triton's own GPU compiler and the ptxas it ships, with
# no GPU present: the interpreter accepts code this rejects. Runs outside the interpreter.
GPU_COMPILE = r"""
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from minilm.model.attention import triton_paged as tp

def compile_for_sm90(fn, types, consts, num_warps=4, num_stages=2):
    sig = {name: "constexpr" if name in consts else types[name] for name in fn.arg_names}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    # 99 KiB: the shared memory one block may use on the smallest current NVIDIA parts (sm_86/sm_89).
    assert kernel.metadata.shared <= 99 * 1024, (fn.__name__, consts, kernel.metadata.shared)

def attention(dtype, group, head_dim, num_tokens, num_seqs, segments):
    cfg = tp.launch_config(num_tokens, num_seqs, group, head_dim, dtype.itemsize)
    e = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}[dtype]
    types = dict(q_ptr=e, k_cache_ptr=e, v_cache_ptr=e, out_ptr=e, seg_max_ptr="*fp32", seg_sum_ptr="*fp32",
                 seg_out_ptr="*fp32", cu_seqlens_q_ptr="*i32", context_lens_ptr="*i32", block_tables_ptr="*i32",
                 num_seqs="i32", qk_scale="fp32", stride_qt="i32", stride_qh="i32", stride_ot="i32",
                 stride_oh="i32", stride_cb="i32", stride_cs="i32", stride_ch="i32", stride_bt="i32")
    consts = dict(GROUP=group, BLOCK_Q=cfg["BLOCK_Q"], BLOCK_M=cfg["BLOCK_M"], TILE_N=cfg["TILE_N"],
                  BLOCK_SIZE=16, HEAD_DIM=head_dim, HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"], NUM_SEGMENTS=segments,
                  DOT_PRECISION=tp._dot_precision(dtype))
    compile_for_sm90(tp._paged_attention_kernel, types, consts, cfg["num_warps"], cfg["num_stages"])
    if segments > 1:
        types = dict(seg_max_ptr="*fp32", seg_sum_ptr="*fp32", seg_out_ptr="*fp32", out_ptr=e,
                     num_q_heads="i32", stride_ot="i32", stride_oh="i32")
        compile_for_sm90(tp._merge_segments_kernel, types,
                         dict(NUM_SEGMENTS=segments, HEAD_DIM=head_dim, HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"]))

attention(torch.bfloat16, 4, 128, 64, 64, 1)      # the benchmark's decode step
attention(torch.bfloat16, 4, 128, 4096, 1, 1)     # its prefill chunk
attention(torch.bfloat16, 4, 128, 4, 4, 16)       # its split-KV decode + merge
attention(torch.float32, 2, 32, 40, 4, 1)         # the tiny model's mixed step (engine default fp32)
attention(torch.float32, 4, 128, 4096, 1, 1)      # a Llama-shaped fp32 prefill: the largest tiles
attention(torch.float16, 3, 32, 40, 4, 2)         # the docstrings checkpoint (GQA group 3), split-KV
attention(torch.bfloat16, 7, 64, 4096, 1, 1)      # a Qwen2.5-0.5B-shaped prefill (group 7)
types = dict(k_ptr="*fp32", v_ptr="*fp32", k_cache_ptr="*fp16", v_cache_ptr="*fp16", slot_mapping_ptr="*i64",
             stride_kt="i32", stride_kh="i32", stride_vt="i32", stride_vh="i32", stride_cb="i32",
             stride_cs="i32", stride_ch="i32")
compile_for_sm90(tp._write_kv_kernel, types, dict(NUM_KV_HEADS=8, HEADS_PAD=8, HEAD_DIM=128, HEAD_DIM_PAD=128,
                                                  BLOCK_SIZE=16))
print("compiled")
"""


def test_kernels_compile_for_a_gpu():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(
        os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(Path(__file__).resolve().parents[1])
    )
    run = subprocess.run(
        [sys.executable, "-c", GPU_COMPILE], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
