"""The Triton paged-attention kernel against the pure-torch reference (CPU: Triton's interpreter).

Every case uses fresh random inputs, a scrambled block table (shuffled blocks, random
ids in the unused tail) and a cache that is random everywhere, so reading a wrong
slot changes the answer; outputs are poisoned with NaN first, so an element the
kernel forgot to write fails. The shapes obey the GPU's rules (see triton_paged.py),
and the launch configuration is the one a GPU gets for the same batch; the last test
compiles the kernels for an H100/H200 with Triton's GPU compiler, no GPU needed.
"""
from __future__ import annotations

import pytest
import torch

from minilm import Engine, EngineConfig
from minilm.attention import reference, triton_paged
from minilm.model import AttentionMetadata

TOL = {torch.float32: 1e-3, torch.float16: 1e-2}

# (new tokens per sequence, context length per sequence: cached + new)
DECODE = ([1, 1, 1, 1], [1, 17, 64, 130])                      # incl. a single-token context
PREFILL = ([1, 20, 37], [1, 20, 37])                           # whole prompts, lengths not multiples of 16
MIXED = ([1, 24, 0, 13, 1, 40], [90, 24, 5, 61, 33, 40])       # decodes, a prompt, a chunk continuing
                                                                # a prefill (48 cached + 13), an idle sequence
LONG = ([1, 20, 1], [700, 820, 1000])                          # long contexts: many tiles and blocks


def make_batch(q_lens, ctx_lens, group, head_dim, dtype, block_size=16, num_kv_heads=2, seed=0):
    """Random q and caches, and metadata whose block tables point at shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 7  # some blocks nobody owns
    width = max(blocks_per_seq) + 2
    shuffled = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (len(ctx_lens), width), generator=gen, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = shuffled[used:used + n]
        used += n
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(cu_seqlens_q=cu, context_lens=torch.tensor(ctx_lens, dtype=torch.int32),
                             block_tables=tables, slot_mapping=torch.zeros(0, dtype=torch.int64))

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    q = randn(int(cu[-1]), num_kv_heads * group, head_dim)
    return q, randn(*cache_shape), randn(*cache_shape), meta


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
@pytest.mark.parametrize("case,block_size", [(MIXED, 16), (DECODE, 16), (PREFILL, 32)],
                         ids=["mixed", "decode", "prefill"])
def test_unified_matches_reference(case, block_size, group, head_dim, dtype):
    q, kc, vc, meta = make_batch(*case, group, head_dim, dtype, block_size, seed=group * head_dim)
    out = triton_paged.attention_unified(q, kc, vc, meta, head_dim ** -0.5, out=poisoned(q))
    check(out, q, kc, vc, meta, head_dim ** -0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_long_contexts(dtype):
    q, kc, vc, meta = make_batch(*LONG, group=4, head_dim=64, dtype=dtype, block_size=16, seed=1)
    out = triton_paged.attention_unified(q, kc, vc, meta, 0.125, out=poisoned(q))
    check(out, q, kc, vc, meta, 0.125)


def test_block_size_not_a_power_of_two():
    # The kernel maps each key position to (block, slot) itself, so any block size works.
    q, kc, vc, meta = make_batch(*MIXED, group=2, head_dim=32, dtype=torch.float32, block_size=12, seed=2)
    check(triton_paged.attention_unified(q, kc, vc, meta, 0.2, out=poisoned(q)), q, kc, vc, meta, 0.2)


@pytest.mark.parametrize("segments", [2, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_split_kv_matches_reference(segments, dtype):
    # Contexts from 3 tokens (most of its 16 segments are empty) to 700.
    q, kc, vc, meta = make_batch([1, 1, 1], [3, 200, 700], group=4, head_dim=32, dtype=dtype, seed=segments)
    partials = tuple(torch.full_like(p, float("nan")) for p in triton_paged.new_partials(q, segments))
    out = triton_paged.attention_split_kv(q, kc, vc, meta, 0.2, segments, out=poisoned(q), partials=partials)
    check(out, q, kc, vc, meta, 0.2)


def test_split_kv_is_exact_for_prompt_chunks_too():
    # The dispatcher only splits decode steps, but the split path is correct for any batch.
    q, kc, vc, meta = make_batch([1, 6, 3], [40, 70, 3], group=2, head_dim=32, dtype=torch.float32, seed=3)
    check(triton_paged.attention_split_kv(q, kc, vc, meta, 0.2, 4, out=poisoned(q)), q, kc, vc, meta, 0.2)


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


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_write_kv_matches_reference(cache_dtype):
    gen = torch.Generator().manual_seed(5)
    num_blocks, block_size, hkv, d, t = 6, 16, 2, 32, 11
    k, v = torch.randn(t, hkv, d, generator=gen), torch.randn(t, hkv, d, generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t]
    slots[[2, 7]] = -1  # -1: do not store (e.g. padding)
    caches = [torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(cache_dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    reference.write_kv(k, v, *expected, slots)
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
        engine = Engine("tiny", EngineConfig(policy="chunked", attention_backend=backend, max_num_seqs=4,
                                             max_num_batched_tokens=24, max_model_len=128))
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
GPU_COMPILE = r'''
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from minilm.attention import triton_paged as tp

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
types = dict(k_ptr="*fp32", v_ptr="*fp32", k_cache_ptr="*fp16", v_cache_ptr="*fp16", slot_mapping_ptr="*i64",
             stride_kt="i32", stride_kh="i32", stride_vt="i32", stride_vh="i32", stride_cb="i32",
             stride_cs="i32", stride_ch="i32")
compile_for_sm90(tp._write_kv_kernel, types, dict(NUM_KV_HEADS=8, HEADS_PAD=8, HEAD_DIM=128, HEAD_DIM_PAD=128,
                                                  BLOCK_SIZE=16))
print("compiled")
'''


def test_kernels_compile_for_a_gpu():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    run = subprocess.run([sys.executable, "-c", GPU_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
