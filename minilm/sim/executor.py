"""The simulator: the real scheduler, allocator and timeline, with no model at all.

    engine = simulated_engine("llama-3-8b", "h100", policy="chunked")
    engine.add_workload(make_workload("mixed", 1000, vocab_size=engine.model_config.vocab_size))
    timeline = engine.run()      # seconds on the timeline are simulated, not measured

`SimulatedExecutor` stands in for the model: each sequence that samples gets a
placeholder token that is never the end-of-sequence token, so every request runs to
its `max_tokens`. `SimulatedClock` (core/clock.py) advances by the cost model's
prediction for the step (costmodel.py), so the same inputs give the same timeline,
bit for bit, on any machine. Arrival times are honoured: the engine's clock jumps to
the next arrival when nothing can run.
"""
from __future__ import annotations

from dataclasses import replace

from ..config import EngineConfig, ModelConfig
from ..core.clock import SimulatedClock
from ..core.engine import Engine
from ..plan import ModelOutput, StepPlan
from .costmodel import CostModel, DeviceSpec, EngineKind


class SimulatedExecutor:
    """Produces a placeholder token for every sequence that samples; computes nothing."""

    kind = "simulated"

    def __init__(self, cost: CostModel):
        self.cost, self.model_config = cost, cost.model
        eos = cost.model.eos_token_id
        self.token_id = 1 if eos == 0 else 0  # any id but EOS: lengths come from max_tokens

    def describe(self) -> dict:
        return {"model": self.cost.name, "backend": "simulated", "simulated": True, **self.cost.describe()}

    def execute(self, plan: StepPlan) -> ModelOutput:
        return ModelOutput({w.request.request_id: [self.token_id] for w in plan.work if w.samples})

    def forget(self, request_id: str) -> None:
        pass


def simulated_engine(model: str | ModelConfig = "llama-3-8b", device: str | DeviceSpec = "h100",
                     policy=None, config: EngineConfig | None = None, *, dtype: str | None = None,
                     tp: int = 1, engine: str | EngineKind | None = None, kv_cache_dtype: str = "auto",
                     **knobs) -> Engine:
    """An engine that simulates `model` (a name from costmodel.MODEL_SPECS or a config.json)
    on `device` (h100, h200, a100, l40s, l4, rtx4090, cpu).

    The KV cache gets the blocks that fit in the device memory left after the weights
    (`gpu_memory_utilization`, vLLM's knob) unless `num_blocks` or `kv_cache_bytes` is
    given. `dtype` defaults to the device's serving dtype (bfloat16 on GPUs). `engine` picks
    another kind of engine's step overhead (costmodel.ENGINE_KINDS: vllm, cpp, compiled,
    eager). The `quantization` knob (int8, fp8) is priced by the cost model, as is
    `kv_cache_dtype="fp8"` (vLLM's knob: one byte per K/V number, so twice the blocks fit).
    Other keyword arguments are EngineConfig knobs (max_num_seqs, ...).
    """
    if policy is not None:
        knobs["policy"] = policy
    config = replace(config or EngineConfig(), **knobs)
    cost = CostModel(model, device, dtype=dtype, tp=tp, engine=engine, quantization=config.quantization,
                     kv_cache_dtype=kv_cache_dtype)
    config = replace(config, dtype=cost.dtype)
    config.validate()
    if config.num_blocks is None:  # kv_cache_bytes holds blocks of the KV cache's own dtype (fp8: one byte a number)
        kv_bytes = config.kv_cache_bytes or cost.kv_cache_bytes(config.gpu_memory_utilization)
        config = replace(config, num_blocks=kv_bytes // (config.block_size * cost.kv_bytes_per_token))
    return Engine(SimulatedExecutor(cost), config, clock=SimulatedClock(cost.step_time))
