"""Small shared builders for the tests."""
from __future__ import annotations

import random
from collections import OrderedDict

from minilm import Engine, EngineConfig
from minilm.config import ModelConfig

# The smallest config that still has GQA, several layers and RoPE: tests run fast on 2 cores.
MICRO = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, eos_token_id=None, bos_token_id=None)


def micro_model(seed: int = 0, cfg: ModelConfig = MICRO):
    from minilm.model import LlamaModel

    return LlamaModel(cfg).init_random(seed, std=0.5)


def scramble_free_list(engine: Engine, seed: int = 0) -> None:
    """Hand out KV blocks in a random order, so block tables are non-contiguous."""
    pool = engine.kv_cache.pool
    order = list(pool.free)
    random.Random(seed).shuffle(order)
    pool.free = order if isinstance(pool.free, list) else OrderedDict.fromkeys(order)  # prefix caching's LRU queue


def engine(policy: str = "continuous", model=None, scramble: bool = True, clock=None, **knobs) -> Engine:
    e = Engine(model if model is not None else micro_model(), EngineConfig(policy=policy, **knobs), clock=clock)
    if scramble:
        scramble_free_list(e)
    return e
