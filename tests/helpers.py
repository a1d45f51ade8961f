"""Small shared builders for the tests."""

from __future__ import annotations

import random
from collections import OrderedDict

import torch

from minilm import Engine, EngineConfig
from minilm.config import ModelConfig
from minilm.model.llama import AttentionMetadata

# The smallest config that still has GQA, several layers and RoPE: tests run fast on 2 cores.
MICRO = ModelConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    eos_token_id=None,
    bos_token_id=None,
)


def micro_model(seed: int = 0, cfg: ModelConfig = MICRO):
    from minilm.model.llama import LlamaModel

    return LlamaModel(cfg).init_random(seed, std=0.5)


def scramble_free_list(engine: Engine, seed: int = 0) -> None:
    """Hand out KV blocks in a random order, so block tables are non-contiguous."""
    pool = engine.kv_manager.pool
    order = list(pool.free)
    random.Random(seed).shuffle(order)
    pool.free = (
        order if isinstance(pool.free, list) else OrderedDict.fromkeys(order)
    )  # prefix caching's LRU queue


def engine(
    policy: str = "continuous", model=None, scramble: bool = True, clock=None, **knobs
) -> Engine:
    e = Engine(
        model if model is not None else micro_model(),
        EngineConfig(policy=policy, **knobs),
        clock=clock,
    )
    if scramble:
        scramble_free_list(e)
    return e


def paged_attention_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    *,
    nan_outside_context: bool = False,
    block_size: int = 16,
    num_kv_heads: int = 2,
    seed: int = 0,
):
    """(q, k_cache, v_cache, metadata) for an attention backend test: fresh random numbers,
    block tables pointing at shuffled blocks with random ids in each table's unused tail,
    and some blocks nobody owns. With `nan_outside_context`, every cache slot that no
    sequence's context covers holds NaN, so a backend that reads one poisons its answer
    (the Triton kernel loads whole key tiles and masks scores, so it needs finite numbers
    there: its test relies on random ones changing the answer instead)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 6
    shuffled = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(
        0, num_blocks, (len(ctx_lens), max(blocks_per_seq) + 2), generator=gen, dtype=torch.int32
    )
    covered = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    used = 0
    for i, (n, c) in enumerate(zip(blocks_per_seq, ctx_lens)):
        tables[i, :n] = shuffled[used : used + n]
        used += n
        pos = torch.arange(c)
        covered[tables[i, pos // block_size].long(), pos % block_size] = True
    caches = [
        torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
        for _ in "kv"
    ]
    if nan_outside_context:
        for cache in caches:
            cache[~covered] = float("nan")
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(
        cu_seqlens_q=cu,
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.zeros(0, dtype=torch.int64),
    )
    q = torch.randn(int(cu[-1]), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    return q, caches[0], caches[1], meta
