"""Checks for the lab's exercises: one `check_*` function per exercise.

An exercise notebook and its solution call the same check, so a solution can never
pass a weaker test than the learner's code. Each check runs the learner's code
against the real engine (or an independent computation), raises AssertionError with
a hint when something is off, and prints one line when all is well.
"""
from __future__ import annotations

import math
import random

import torch

from minilm import Engine, RequestSpec, make_workload, run_workload, summarize
from minilm.attention.reference import paged_attention
from minilm.kv_cache import cdiv
from minilm.model import AttentionMetadata


def ok(message: str) -> None:
    print(f"passed: {message}")


# ---- exercise 0: reading a timeline ---------------------------------------------------
def check_tokens_by_kind(tokens_by_kind) -> None:
    specs = make_workload("uniform", num_requests=6, seed=1)
    tl = run_workload(specs, policy="static", max_num_seqs=3, sampling={"ignore_eos": True})
    got = tokens_by_kind(tl)
    df = tl.steps_df()
    want = {k: int(df[f"{k}_tokens"].sum()) for k in ("prefill", "decode", "padding")}
    assert isinstance(got, dict), f"return a dict, got {type(got).__name__}"
    assert set(got) == set(want), f"keys should be {sorted(want)}, got {sorted(got)}"
    for k in want:
        assert got[k] == want[k], f"{k}: you counted {got[k]}, the timeline has {want[k]}"
    ok(f"tokens by kind on a static run: {want}")


# ---- exercise 1: the roofline -----------------------------------------------------------
def check_roofline(linear_flops, decode_bytes, roofline_time) -> None:
    # Llama-3-8B-like numbers, written out by hand (not with your functions)
    assert math.isclose(linear_flops(8.0e9, 512), 8.192e12), "2 FLOPs per parameter per token"
    assert math.isclose(linear_flops(1.0e6, 1), 2.0e6)
    # 16 GB of weights, 128 KiB of KV per token, two sequences of 1000 and 3000 tokens
    assert math.isclose(decode_bytes(16e9, 131072, [1000, 3000]), 16e9 + 131072 * 4000), \
        "weights once per step, plus every cached token's K and V of every sequence"
    assert math.isclose(decode_bytes(16e9, 131072, []), 16e9), "an empty batch still reads... the weights"
    # memory-bound: 16 GB at 3.35 TB/s beats 2 GFLOP at 989 TFLOP/s
    assert math.isclose(roofline_time(2e9, 16e9, 989e12, 3.35e12), 16e9 / 3.35e12)
    # compute-bound: 8.2 TFLOP at 989 TFLOP/s beats 16 GB at 3.35 TB/s
    assert math.isclose(roofline_time(8.192e12, 16e9, 989e12, 3.35e12), 8.192e12 / 989e12)
    # the crossover: a step with intensity FLOPs/byte == peak/bandwidth sits on the ridge
    ridge = 989e12 / 3.35e12
    t = roofline_time(ridge * 1e9, 1e9, 989e12, 3.35e12)
    assert math.isclose(t, 1e9 / 3.35e12), "at the ridge point compute and memory take the same time"
    ok(f"roofline estimate (ridge point of this example: {ridge:.0f} FLOP/byte)")


# ---- exercise 2: static batching's padding ----------------------------------------------
def check_static_padding(static_padding) -> None:
    assert static_padding([5, 5], [3, 3]) == 0, "equal prompts and outputs: nothing to pad"
    specs = make_workload("uniform", num_requests=5, seed=2)
    tl = run_workload(specs, policy="static", max_num_seqs=5, sampling={"ignore_eos": True})
    df = tl.steps_df()
    want = int(df["padding_tokens"].sum())
    got = static_padding([len(s.prompt_ids) for s in specs], [s.max_tokens for s in specs])
    assert got == want, f"you predict {got} padding tokens; the engine computed {want}"
    ok(f"{want} padding tokens predicted for one static batch of 5, "
       f"{want / int(df['num_tokens'].sum()):.1%} of all computed tokens")


# ---- exercise 3: a policy of your own ----------------------------------------------------
def check_policy(make_policy) -> None:
    specs = make_workload("mixed", num_requests=10, seed=3, max_model_len=512)
    knobs = dict(max_num_seqs=4, max_model_len=512, sampling={"ignore_eos": True})
    mine = run_workload(specs, policy=make_policy(), **knobs)
    ref = run_workload(specs, policy="continuous", **knobs)
    for a, b in zip(mine.steps, ref.steps):
        got = [(i.request_id, i.kind, i.num_tokens) for i in a.items]
        want = [(i.request_id, i.kind, i.num_tokens) for i in b.items]
        assert got == want, f"step {a.step}: your policy ran {got}, continuous batching runs {want}"
    assert len(mine.steps) == len(ref.steps), f"{len(mine.steps)} steps, continuous takes {len(ref.steps)}"
    # a tight KV cache: the policy must survive preemption and still finish everyone
    tight = run_workload(specs, policy=make_policy(), num_blocks=24, **knobs)
    lens = {r.request_id: r.output_len for r in tight.requests}
    assert lens == {s.id: s.max_tokens for s in specs}, "with 24 KV blocks, some request did not finish right"
    ok(f"same {len(ref.steps)} steps as continuous batching; "
       f"{summarize(tight)['preemptions']} preemptions survived with 24 blocks")


# ---- exercise 4: a block allocator -------------------------------------------------------
def check_allocator(make_pool, blocks_needed, slot) -> None:
    check_pool(make_pool)
    check_block_arithmetic(blocks_needed, slot)
    steps = check_pool_in_engine(make_pool)
    ok("300 random get/free calls: no block handed out twice, none lost, a failed get changes nothing; "
       f"blocks and slots computed right; the engine ran {steps} steps on your pool with the same tokens")


def check_pool(make_pool) -> None:
    rng = random.Random(4)
    num_blocks = 12
    pool = make_pool(num_blocks)
    held: list[list[int]] = []
    for step in range(300):
        if held and rng.random() < 0.4:
            pool.free_blocks(held.pop(rng.randrange(len(held))))
        else:
            n = rng.randrange(0, 6)
            before = pool.num_free_blocks
            try:
                got = pool.get_new_blocks(n)
            except NotImplementedError:
                raise
            except RuntimeError:
                assert n > before, f"get_new_blocks({n}) raised with {before} blocks free"
                assert pool.num_free_blocks == before, "a failed get_new_blocks must change nothing"
                continue
            assert n <= before, f"get_new_blocks({n}) succeeded with only {before} blocks free"
            assert len(got) == n, f"get_new_blocks({n}) returned {len(got)} blocks"
            held.append(list(got))
        owned = [b for blocks in held for b in blocks]
        assert len(owned) == len(set(owned)), f"step {step}: a block was handed out twice: {sorted(owned)}"
        assert all(0 <= b < num_blocks for b in owned), f"step {step}: a block id outside 0..{num_blocks - 1}"
        assert len(owned) + pool.num_free_blocks == num_blocks, f"step {step}: held + free != {num_blocks}"


def check_block_arithmetic(blocks_needed, slot) -> None:
    for num_tokens, held, size, want in [(0, 0, 4, 0), (1, 0, 4, 1), (4, 0, 4, 1), (5, 0, 4, 2), (5, 2, 4, 0),
                                         (9, 2, 4, 1), (3, 3, 4, 0), (17, 1, 16, 1), (33, 0, 16, 3)]:
        got = blocks_needed(num_tokens, held, size)
        assert got == want, f"blocks_needed({num_tokens}, {held}, {size}) = {got}, expected {want}"
    table = [7, 2, 9]
    for position, want in [(0, 28), (3, 31), (4, 8), (7, 11), (8, 36), (11, 39)]:
        got = slot(table, position, 4)
        assert got == want, f"slot({table}, {position}, 4) = {got}, expected {want}"


def check_pool_in_engine(make_pool) -> int:
    """Run the real engine on the learner's pool, with a cache small enough to preempt."""
    rng = random.Random(44)
    specs = [RequestSpec(f"r{i}", [rng.randrange(256) for _ in range(rng.randrange(5, 30))],
                         max_tokens=rng.randrange(5, 30)) for i in range(8)]

    def run(block_pool):
        engine = Engine("tiny", policy="continuous", max_num_seqs=4, block_size=4, num_blocks=24, max_model_len=64,
                        block_pool=block_pool)
        engine.add_workload(specs, ignore_eos=True)
        return engine.run()

    mine, ref = run(make_pool), run(None)
    assert [r.output_ids for r in mine.requests] == [r.output_ids for r in ref.requests], \
        "the engine generated different tokens on your pool: some K/V went to the wrong block"
    assert summarize(mine)["preemptions"] == summarize(ref)["preemptions"] > 0
    return len(mine.steps)


# ---- exercise 5: the ragged batch's metadata ---------------------------------------------
def dense_causal_attention(q, k, v, scale):
    """One sequence, no cache, no paging: the textbook formula (the independent ground truth)."""
    n, ctx = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)


def check_ragged_metadata(ragged_metadata) -> None:
    torch.manual_seed(5)
    block_size, heads, dim, num_blocks = 4, 2, 8, 32
    query_lens, cached_lens = [5, 3, 1, 1], [0, 6, 9, 2]  # a prompt, a chunk, two decodes
    order = torch.randperm(num_blocks).tolist()  # scrambled tables: nothing may assume order
    tables, used = [], 0
    for q_len, c_len in zip(query_lens, cached_lens):
        n = cdiv(q_len + c_len, block_size)
        tables.append(order[used:used + n])
        used += n
    meta = ragged_metadata(query_lens, cached_lens, tables, block_size)
    assert isinstance(meta, AttentionMetadata), "return a minilm.model.AttentionMetadata"
    assert meta.cu_seqlens_q.tolist() == [0, 5, 8, 9, 10], f"cu_seqlens_q {meta.cu_seqlens_q.tolist()}"
    assert meta.context_lens.tolist() == [5, 9, 10, 3], f"context_lens {meta.context_lens.tolist()}: cached + new"
    # fill the cache through the slot mapping, then attend with the reference backend
    seqs = [(torch.randn(c + q, heads, dim), torch.randn(c + q, heads, dim))
            for q, c in zip(query_lens, cached_lens)]
    # unused slots hold large garbage: attending to one of them shows in the result
    k_cache = 100 * torch.randn(num_blocks, block_size, heads, dim)
    v_cache = 100 * torch.randn(num_blocks, block_size, heads, dim)
    for (k, v), table in zip(seqs, tables):
        for p in range(k.shape[0]):
            k_cache[table[p // block_size], p % block_size] = k[p]
            v_cache[table[p // block_size], p % block_size] = v[p]
    slots = meta.slot_mapping.tolist()
    want_slots = [t[p // block_size] * block_size + p % block_size
                  for q, c, t in zip(query_lens, cached_lens, tables) for p in range(c, c + q)]
    assert slots == want_slots, f"slot_mapping {slots[:6]}...; each new token's block * block_size + offset"
    q = torch.randn(sum(query_lens), heads, dim)
    out = paged_attention(q, k_cache, v_cache, meta, dim ** -0.5)
    cu = meta.cu_seqlens_q.tolist()
    for i, (k, v) in enumerate(seqs):
        want = dense_causal_attention(q[cu[i]:cu[i + 1]], k, v, dim ** -0.5)
        assert torch.allclose(out[cu[i]:cu[i + 1]], want, atol=1e-5), f"sequence {i}: attention differs"
    ok("metadata for a prompt, a chunk and two decodes gives the textbook attention")


# ---- exercise 6: the chunk-splitting rule ------------------------------------------------
def check_split_budget(split_budget) -> None:
    assert split_budget(16, 4, [30]) == [12], "4 decodes first, then 12 prompt tokens"
    assert split_budget(16, 0, [5, 30]) == [5, 11], "whole short prompt, then a chunk of the next"
    assert split_budget(16, 16, [30]) == [0], "decodes used the whole budget"
    assert split_budget(16, 2, []) == [], "no prompts, no chunks"
    # the engine's chunked policy, step by step, on a workload with no KV pressure
    budget = 48
    specs = make_workload("uniform", num_requests=6, seed=6)
    tl = run_workload(specs, policy="chunked", max_num_batched_tokens=budget, max_num_seqs=6,
                      sampling={"ignore_eos": True})
    remaining = {s.id: len(s.prompt_ids) for s in specs}
    for step in tl.steps:
        decodes = sum(i.kind == "decode" for i in step.items)
        pending = [rid for rid, n in remaining.items() if n > 0]
        got = split_budget(budget, decodes, [remaining[r] for r in pending])
        want = [next((i.num_tokens for i in step.items if i.request_id == r and i.kind == "prefill"), 0)
                for r in pending]
        assert got == want, f"step {step.step}: you split {got}, the engine ran chunks {want}"
        for r, n in zip(pending, want):
            remaining[r] -= n
    ok(f"same chunks as the engine in all {len(tl.steps)} steps of a {budget}-token budget run")


# ---- exercise 7: goodput -----------------------------------------------------------------
def check_goodput(goodput) -> None:
    specs = make_workload("mixed", num_requests=12, seed=7, rate=200.0, max_model_len=512)
    tl = run_workload(specs, policy="continuous", max_num_seqs=4, max_model_len=512,
                      sampling={"ignore_eos": True})
    ttfts = sorted(r.t_first_token - r.arrival for r in tl.requests)
    for ttft_slo in (ttfts[3], ttfts[8], None):  # SLOs that some, most, all requests meet
        for tpot_slo in (None, summarize(tl)["tpot_p50"]):
            want = summarize(tl, ttft_slo=ttft_slo, tpot_slo=tpot_slo)["goodput_req_per_s"] \
                if (ttft_slo, tpot_slo) != (None, None) else len(tl.requests) / summarize(tl)["wall_s"]
            got = goodput(tl, ttft_slo, tpot_slo)
            assert math.isclose(got, want, rel_tol=1e-9), \
                f"ttft_slo={ttft_slo}, tpot_slo={tpot_slo}: you got {got:.3f} req/s, expected {want:.3f}"
    ok("goodput matches minilm.metrics for six SLO combinations")
