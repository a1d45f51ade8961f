"""The `sdpa` CPU attention backend against the pure-torch reference.

Every case builds fresh random inputs: block tables that point at shuffled blocks (with
random ids in each table's unused tail), and a cache whose slots past every context and
in blocks nobody owns hold NaN, so reading one poisons the result. The output buffer is
NaN too, so a row the backend forgets to write fails.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch
from helpers import paged_attention_batch, scramble_free_list

from minilm import Engine, EngineConfig
from minilm.config import ATTENTION_BACKENDS
from minilm.model.attention import get_backend, reference, sdpa

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}

# (new tokens per sequence, context length per sequence: cached + new)
DECODE = ([1, 1, 1, 1, 1, 1], [1, 5, 17, 64, 130, 33])  # a 1-token context; lengths off block edges
PREFILL = ([1, 20, 37, 16], [1, 20, 37, 16])  # whole prompts (a 1-token one is a "decode")
MIXED = (
    [1, 24, 0, 13, 1, 40, 1],
    [90, 24, 5, 61, 33, 40, 2],
)  # decodes, prompts, a chunk continuing a
# prefill (48 cached + 13), an idle sequence
CHUNKS = ([7, 16, 3], [23, 48, 100])  # only chunks after earlier ones
CASES = {"decode": DECODE, "prefill": PREFILL, "mixed": MIXED, "chunks": CHUNKS}


# NaN in every cache slot no context covers: reading one poisons the answer
make_batch = partial(paged_attention_batch, nan_outside_context=True)


def check(q, k_cache, v_cache, meta, scale):
    out = sdpa.paged_attention(
        q, k_cache, v_cache, meta, scale, out=torch.full_like(q, float("nan"))
    )
    ref = reference.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale)
    assert torch.isfinite(out).all(), (
        "NaN in the output: a row never written, or a slot past a context read"
    )
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < TOL[q.dtype], f"relative error {err:.2e} >= {TOL[q.dtype]:.0e} ({q.dtype})"


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, group, dtype):
    q, kc, vc, meta = make_batch(*CASES[case], group, 32, dtype, seed=group)
    check(q, kc, vc, meta, 32**-0.5)


@pytest.mark.parametrize("block_size", [1, 12, 32])
def test_other_block_sizes(block_size):
    q, kc, vc, meta = make_batch(
        *MIXED, group=2, head_dim=64, dtype=torch.float32, block_size=block_size, seed=3
    )
    check(q, kc, vc, meta, 0.125)


def test_decodes_of_very_different_lengths_form_several_groups():
    lens = [3, 4, 700, 30, 650, 90, 1, 200]
    q, kc, vc, meta = make_batch(
        [1] * len(lens), lens, group=4, head_dim=32, dtype=torch.float32, seed=4
    )
    decodes, _ = sdpa.build_layout(meta, 16)
    assert len(decodes) > 1
    check(q, kc, vc, meta, 0.2)


def test_length_groups_bound_padding():
    lens = sorted([1000, 990, 700, 650, 400, 90, 60, 59, 3, 1], reverse=True)
    groups = sdpa.length_groups(lens)
    assert [i for a, b in groups for i in range(a, b)] == list(
        range(len(lens))
    )  # every one, in order, once
    for a, b in groups:
        assert lens[b - 1] * sdpa.MAX_PADDING >= lens[a]
    assert sdpa.length_groups([]) == []


def test_layout_is_rebuilt_for_new_metadata():
    """The per-step layout cache must not serve one step's layout to the next."""
    for seed, case in enumerate([DECODE, MIXED, DECODE, CHUNKS]):
        check(*make_batch(*case, group=2, head_dim=32, dtype=torch.float32, seed=seed), 0.2)


def test_layout_is_kept_per_step_metadata():
    """The layout is built once per metadata (one step) and serves all its layers; the next
    step's metadata gets its own."""
    q, kc, vc, meta = make_batch(*DECODE, group=2, head_dim=32, dtype=torch.float32, seed=6)
    check(q, kc, vc, meta, 0.2)
    layout = meta.scratch["sdpa"]
    check(q, kc, vc, meta, 0.2)
    assert meta.scratch["sdpa"] is layout
    shorter = replace(meta, context_lens=(meta.context_lens - 1).clamp(min=1), scratch={})
    check(q, kc, vc, shorter, 0.2)
    assert shorter.scratch["sdpa"] is not layout


def test_write_kv_stores_each_token_at_its_slot_and_nothing_else():
    # sdpa's write_kv is the reference's: one indexed store per tensor, checked here token by token
    gen = torch.Generator().manual_seed(5)
    num_blocks, block_size, hkv, d, t = 6, 16, 2, 32, 11
    k, v = torch.randn(t, hkv, d, generator=gen), torch.randn(t, hkv, d, generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t]
    caches = [torch.randn(num_blocks, block_size, hkv, d, generator=gen) for _ in range(2)]
    expected = [c.clone() for c in caches]
    for token, slot in enumerate(slots.tolist()):
        for cache, new in zip(expected, (k, v)):
            cache[slot // block_size, slot % block_size] = new[token]
    sdpa.write_kv(k, v, *caches, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_registered():
    assert "sdpa" in ATTENTION_BACKENDS
    assert get_backend("sdpa") == (sdpa.paged_attention, sdpa.write_kv)


@pytest.mark.parametrize(
    "policy,knobs",
    [
        ("continuous", {}),
        (
            "chunked",
            dict(max_num_batched_tokens=24),
        ),  # chunks continuing earlier ones, next to decodes
        ("static", {}),  # padded rows
    ],
)
def test_engine_greedy_tokens_match_reference(policy, knobs):
    prompts = {
        "a": list(range(3, 40)),
        "b": [7, 8, 9],
        "c": list(range(100, 121)),
        "d": [5] * 50,
        "e": [11],
    }

    def run(backend):
        engine = Engine(
            "tiny",
            EngineConfig(
                policy=policy, attention_backend=backend, max_num_seqs=4, max_model_len=128, **knobs
            ),
        )
        scramble_free_list(engine)
        for rid, ids in prompts.items():
            engine.add_request(rid, ids, max_tokens=12, ignore_eos=True)
        return {r.request_id: r.output_ids for r in engine.run().requests}

    assert run("sdpa") == run("reference")
