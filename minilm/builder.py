"""Building an engine: resolve the knobs against the model and the policy, then make
the KV cache manager, the executor and the clock. `Engine(...)` and
`simulated_engine(...)` both come here; the engine itself only runs the loop.

What `model` can be, and what it builds:
    "tiny", "docstrings", a checkpoint dir   the real model (loader.py) -> ModelRunner
    a LlamaModel                             the real model, already built -> ModelRunner
    a CostModel                              no model: the simulator -> SimulatedExecutor
    an Executor                              anything that follows the protocol below
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from .attention import BACKENDS
from .clock import MeasuredClock, SimulatedClock
from .config import EngineConfig, ModelConfig
from .costmodel import CostModel
from .kv_cache import KVCacheManager, allocate_kv_tensor, cdiv, num_blocks_for_budget
from .loader import load_model, resolve_dtype, resolve_model_path
from .model import LlamaModel
from .policies import Policy, make_policy
from .runner import ModelRunner
from .scheduler import StepPlan
from .simulator import SimulatedExecutor
from .tokenizer import ByteTokenizer, load_tokenizer


@runtime_checkable
class Executor(Protocol):
    """What the engine runs a step on: the model runner or the simulator."""

    kind: str
    model_config: ModelConfig

    def execute(self, plan: StepPlan) -> dict[str, int]:
        """The sampled token of every sequence that samples in this step."""

    def forget(self, request_id: str) -> None:
        """Drop any state kept for a finished request."""

    def describe(self) -> dict:
        """model, backend, device, dtype, ... for the timeline's meta."""


@dataclass
class EngineParts:
    config: EngineConfig  # resolved: no None left where the engine needs a value
    policy: Policy
    tokenizer: object
    kv_cache: KVCacheManager
    executor: Executor
    clock: MeasuredClock


def default_backend(device: str) -> str:
    """The Triton kernel on a GPU; on a CPU, PyTorch's fused attention over gathered KV
    (attention/sdpa.py: about twice the readable reference's speed, same results)."""
    return "triton" if str(device).startswith("cuda") else "sdpa"


def build(model, config: EngineConfig, *, tokenizer=None, clock=None, block_pool=None) -> EngineParts:
    """Everything an engine needs. Bad knobs raise ValueError before the KV cache is allocated.
    `block_pool(num_blocks)` replaces the KV cache's free list (exercise 4)."""
    config.validate()
    if config.attention_backend is not None and config.attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend={config.attention_backend!r}; allowed: {', '.join(BACKENDS)}")
    policy = make_policy(config.policy)
    name = "custom"
    if isinstance(model, (str, Path)):
        name = str(model)
        tokenizer = tokenizer or load_tokenizer(resolve_model_path(model))
        model = load_model(model, device=config.device, dtype=config.dtype, seed=config.seed)
    if isinstance(model, LlamaModel):
        model_config = model.config
    elif isinstance(model, CostModel):
        model_config, config = model.model, replace(config, dtype=model.dtype)
    elif isinstance(model, Executor):
        model_config = model.model_config
    else:
        raise ValueError(f"model={model!r}; allowed: a preset or checkpoint name, a checkpoint directory, "
                         f"a LlamaModel, a CostModel or an Executor")
    config = resolve(config, policy, model_config, model if isinstance(model, CostModel) else None)
    if block_pool is not None and config.enable_prefix_caching:
        raise ValueError("block_pool: a pool of your own has no prefix cache; use enable_prefix_caching=False")
    kv_cache = KVCacheManager(config.num_blocks, config.block_size, reserved=config.kv_mode == "reserved",
                              pool=block_pool(config.num_blocks) if block_pool is not None else None,
                              enable_prefix_caching=config.enable_prefix_caching)
    if isinstance(model, LlamaModel):
        executor = model_runner(model, config, name)
    elif isinstance(model, CostModel):
        executor, clock = SimulatedExecutor(model), clock or SimulatedClock(model.step_time)
    else:
        executor = model
    return EngineParts(config, policy, tokenizer or ByteTokenizer(), kv_cache, executor,
                       clock or MeasuredClock(config.device))


def model_runner(model: LlamaModel, config: EngineConfig, name: str) -> ModelRunner:
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(config.cpu_threads)
    kv = allocate_kv_tensor(model.config, config.num_blocks, config.block_size,
                            resolve_dtype(config.dtype), config.device)
    return ModelRunner(model, kv, config.block_size, config.attention_backend, name)


def resolve(config: EngineConfig, policy: Policy, model: ModelConfig, cost: CostModel | None) -> EngineConfig:
    """Fill in the defaults that depend on the model, the policy and the device."""
    limit = model.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} > the model's max_position_embeddings={limit} "
                         f"(the longest sequence it was trained for)")
    config = replace(config, max_model_len=config.max_model_len or limit,
                     attention_backend=config.attention_backend or default_backend(config.device))
    if policy.default_token_budget(config) is None:
        config = replace(config, max_num_batched_tokens=None)  # the policy has no budget
    elif config.max_num_batched_tokens is None:
        config = replace(config, max_num_batched_tokens=policy.default_token_budget(config))
    config.validate()
    if config.num_blocks is None:
        config = replace(config, num_blocks=default_num_blocks(config, model, cost))
    return config


def default_num_blocks(config: EngineConfig, model: ModelConfig, cost: CostModel | None) -> int:
    if config.kv_cache_bytes is not None:
        return num_blocks_for_budget(model, config.block_size, resolve_dtype(config.dtype).itemsize,
                                     config.kv_cache_bytes)
    if cost is not None:  # what the simulated device's memory holds after the weights
        return cost.kv_num_blocks(config.block_size, config.gpu_memory_utilization)
    return config.max_num_seqs * cdiv(config.max_model_len, config.block_size)
