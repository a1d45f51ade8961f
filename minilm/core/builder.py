"""Building an engine (`build`). `model`: a preset or checkpoint name, a checkpoint
directory, a LlamaModel (-> ModelRunner) or an Executor used as it is (the simulator's).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..config import MODEL_PRESETS, EngineConfig, InvalidValue, ModelConfig
from ..model.llama import LlamaModel
from ..model.loader import load_model, resolve_dtype, resolve_model_path
from ..model.quantization import quantize
from ..model.runner import ModelRunner
from ..model.tokenizer import ByteTokenizer, load_tokenizer
from ..plan import Executor
from ..spec_decode import SpeculativeConfig, make_speculative_executor
from ..spec_decode.executor import check_draft_model
from .clock import MeasuredClock
from .kv_cache import KVCacheManager, cdiv
from .policies import Policy, make_policy


def build(model, config: EngineConfig, *, tokenizer=None, clock=None, block_pool=None) -> tuple:
    """(config resolved, policy, tokenizer, KV cache manager, executor, clock): everything an engine
    needs. Bad knobs raise InvalidValue before any weights load. `block_pool(num_blocks)`
    replaces the KV cache's free list (exercise 4)."""
    config, policy = resolve(model, config)
    if block_pool is not None and config.enable_prefix_caching:
        allowed = "a pool of your own has no prefix cache; use enable_prefix_caching=False"
        raise InvalidValue("block_pool", block_pool, allowed)
    name = "custom"
    if isinstance(model, (str, Path)):
        name = str(model)
        tokenizer = tokenizer or load_tokenizer(resolve_model_path(model))
        model = load_model(model, device=config.device, dtype=config.dtype, seed=config.seed)
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
    clock = clock or MeasuredClock(config.device)
    return config, policy, tokenizer or ByteTokenizer(), kv_manager, model, clock


def resolve(model, config: EngineConfig) -> tuple[EngineConfig, Policy]:
    """The knobs resolved (EngineConfig.resolve) and the policy, before anything loads: a model
    by name is read from its config.json. An executor may size its KV cache (`kv_num_blocks`)."""
    if isinstance(model, (str, Path)):
        path = resolve_model_path(model)  # None: a preset
        shape = ModelConfig.from_json(path / "config.json") if path else MODEL_PRESETS[str(model)]
    elif isinstance(model, (LlamaModel, Executor)):
        shape = model.config if isinstance(model, LlamaModel) else model.model_config
    else:
        allowed = "allowed: a preset or checkpoint name or directory, a LlamaModel or an Executor"
        raise InvalidValue("model", model, allowed)
    speculative = SpeculativeConfig.of(config.speculative_config)
    if speculative and isinstance(model, Executor) and not model.speculates:
        allowed = f"executor {model.kind!r} cannot speculate; a model can, and so can the simulator"
        raise InvalidValue("speculative_config", speculative, allowed)
    if speculative and speculative.model and not isinstance(model, Executor):
        check_draft_model(speculative.model, shape)
    sizing = getattr(model, "kv_num_blocks", lambda c: default_num_blocks(c, shape))
    policy = make_policy(config.policy)
    return replace(config, speculative_config=speculative).resolve(shape, policy, sizing), policy


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
