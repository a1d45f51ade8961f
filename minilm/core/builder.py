"""Building an engine: resolve the knobs against the model and the policy, then make the
KV cache manager, the executor and the clock. `model` is a preset or checkpoint name, a
checkpoint directory or a LlamaModel (-> ModelRunner), or an Executor used as it is
(the simulator's is one).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..config import EngineConfig, InvalidValue, ModelConfig
from ..model.llama import LlamaModel
from ..model.loader import load_model, resolve_dtype, resolve_model_path
from ..model.quantization import quantize
from ..model.runner import ModelRunner
from ..model.tokenizer import ByteTokenizer, load_tokenizer
from ..plan import Executor
from ..spec_decode import SpeculativeConfig, make_speculative_executor
from .clock import MeasuredClock
from .kv_cache import KVCacheManager, cdiv
from .policies import Policy, make_policy


def build(model, config: EngineConfig, *, tokenizer=None, clock=None, block_pool=None) -> tuple:
    """(config resolved, policy, tokenizer, KV cache manager, executor, clock): everything an engine
    needs. Bad knobs raise InvalidValue before the KV cache is allocated. `block_pool(num_blocks)`
    replaces the KV cache's free list (exercise 4)."""
    config.validate()
    config = replace(config, speculative_config=SpeculativeConfig.of(config.speculative_config))
    policy = make_policy(config.policy)
    name = "custom"
    if isinstance(model, (str, Path)):
        name = str(model)
        tokenizer = tokenizer or load_tokenizer(resolve_model_path(model))
        model = load_model(model, device=config.device, dtype=config.dtype, seed=config.seed)
    if not isinstance(model, (LlamaModel, Executor)):
        raise InvalidValue(
            "model",
            model,
            "allowed: a preset or checkpoint name, a checkpoint directory, "
            "a LlamaModel or an Executor",
        )
    config = resolve(
        config, policy, model.config if isinstance(model, LlamaModel) else model.model_config
    )
    if block_pool is not None and config.enable_prefix_caching:
        raise InvalidValue(
            "block_pool",
            block_pool,
            "a pool of your own has no prefix cache; use enable_prefix_caching=False",
        )
    kv_manager = KVCacheManager(
        config.num_blocks,
        config.block_size,
        reserved=config.kv_mode == "reserved",
        pool=block_pool(config.num_blocks) if block_pool is not None else None,
        enable_prefix_caching=config.enable_prefix_caching,
    )
    if isinstance(model, LlamaModel):
        if torch.device(config.device).type == "cpu":
            torch.set_num_threads(config.cpu_threads)
        model = ModelRunner(quantize(model, config.quantization), config, name)
        if config.speculative_config:
            model = make_speculative_executor(model, config)
    elif config.speculative_config and not getattr(model, "speculates", False):
        raise InvalidValue(
            "speculative_config",
            config.speculative_config,
            f"executor {model.kind!r} cannot speculate; a model can, and so can the simulator",
        )
    return (
        config,
        policy,
        tokenizer or ByteTokenizer(),
        kv_manager,
        model,
        clock or MeasuredClock(config.device),
    )


def resolve(config: EngineConfig, policy: Policy, model: ModelConfig) -> EngineConfig:
    """Fill in the defaults that depend on the model, the policy and the device."""
    limit = model.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > limit:
        raise InvalidValue(
            "max_model_len",
            config.max_model_len,
            f"must be <= the model's "
            f"max_position_embeddings={limit} (the longest sequence it was trained for)",
        )
    # attention: the Triton kernel on a GPU; on a CPU PyTorch's fused SDPA over gathered KV
    # (model/attention/sdpa.py: about twice the readable reference's speed, same results)
    backend = config.attention_backend or (
        "triton" if str(config.device).startswith("cuda") else "sdpa"
    )
    config = replace(config, max_model_len=config.max_model_len or limit, attention_backend=backend)
    if policy.default_token_budget(config) is None:
        config = replace(config, max_num_batched_tokens=None)  # the policy has no budget
    elif config.max_num_batched_tokens is None:
        config = replace(config, max_num_batched_tokens=policy.default_token_budget(config))
    config.validate()
    if config.num_blocks is None:
        config = replace(config, num_blocks=default_num_blocks(config, model))
    return config


def default_num_blocks(config: EngineConfig, model: ModelConfig) -> int:
    """What `kv_cache_bytes` holds, or room for `max_num_seqs` sequences of `max_model_len`."""
    if config.kv_cache_bytes is None:
        return config.max_num_seqs * cdiv(config.max_model_len, config.block_size)
    block_bytes = config.block_size * model.kv_bytes_per_token(resolve_dtype(config.dtype).itemsize)
    if config.kv_cache_bytes < block_bytes:
        raise InvalidValue(
            "kv_cache_bytes", config.kv_cache_bytes, f"holds no block of {block_bytes} bytes"
        )
    return config.kv_cache_bytes // block_bytes
