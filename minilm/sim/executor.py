"""The simulator: the real scheduler, allocator and timeline, with no model at all.

    engine = simulated_engine("llama-3-8b", "h100", policy="chunked")
    engine.add_workload(make_workload("mixed", 1000, vocab_size=engine.model_config.vocab_size))
    timeline = engine.run()      # seconds on the timeline are simulated, not measured

`SimulatedExecutor` stands in for the model: each sequence that samples gets a
placeholder token that is never the end-of-sequence token, so every request runs to
its `max_tokens`. `SimulatedClock` (core/clock.py) advances by the cost model's
prediction for the step (costmodel.py), so the same inputs give the same timeline,
bit for bit, on any machine. Arrival times are honoured: the engine's clock jumps to
the next arrival when nothing can run. With `speculative_config` it speculates
(speculative.py): an acceptance model says how many drafts each step keeps.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import EngineConfig, ModelConfig
from ..core.clock import SimulatedClock
from ..core.engine import Engine
from ..plan import ModelOutput, StepPlan
from ..spec_decode import SpeculativeConfig
from .costmodel import CostModel, DeviceSpec, EngineKind, get_device
from .fastforward import SimulatedEngine
from .speculative import SimulatedSpeculation, kv_num_blocks, make_speculation


class SimulatedExecutor:
    """Produces a placeholder token for every sequence that samples; computes nothing. With
    `speculation`, as many more as the step accepted drafts, and placeholder drafts for the next."""

    kind = "simulated"

    def __init__(self, cost: CostModel, speculation: SimulatedSpeculation | None = None):
        self.cost, self.model_config = cost, cost.model
        eos = cost.model.eos_token_id
        self.token_id = 1 if eos == 0 else 0  # any id but EOS: lengths come from max_tokens
        self.speculation = speculation
        self.speculates = speculation is not None  # the builder lets it take a speculative_config

    def kv_num_blocks(self, c: EngineConfig) -> int:
        """The builder's num_blocks default: what fits beside the weights (and a draft's)."""
        draft = self.speculation.draft if self.speculation else None
        return kv_num_blocks(
            self.cost, draft, c.block_size, c.gpu_memory_utilization, c.kv_cache_bytes
        )

    def describe(self) -> dict:
        speculation = self.speculation.describe() if self.speculation else {}
        return {
            "model": self.cost.name,
            "backend": "simulated",
            "simulated": True,
            **self.cost.describe(),
            **speculation,
        }

    def step_time(self, plan: StepPlan) -> float:
        """Seconds for a plan (the SimulatedClock's callback): the target's step, then the draft model's."""
        target = self.cost.step_time(plan)
        return target + self.speculation.outcome(plan).draft_time if self.speculation else target

    def execute(self, plan: StepPlan) -> ModelOutput:
        if not self.speculation:
            return ModelOutput({w.request_id: [self.token_id] for w in plan.work if w.samples})
        out = self.speculation.outcome(plan)
        return ModelOutput(
            {rid: [self.token_id] * n for rid, n in out.num_kept.items()},
            draft_token_ids={rid: [self.token_id] * n for rid, n in out.num_drafts.items()},
            draft_time=out.draft_time,
        )

    def forget(self, request_id: str) -> None:
        if self.speculation:
            self.speculation.forget(request_id)


def vllm_default_budget(device: str | DeviceSpec = "h100", online: bool = True) -> int:
    """vLLM's default max_num_batched_tokens on `device` (vllm/engine/arg_utils.py, V1): 8,192
    for `vllm serve` and 16,384 offline (the `LLM` class) on a GPU of 70 GiB or more other than
    an A100, else 2,048 and 8,192. Simulated GPU runs pass it; the lab's own chunked default is
    smaller, sized for its tiny models on a CPU (core/policies.py, lesson 6)."""
    spec = get_device(device)
    large = spec.memory >= 70 * 2**30 and "a100" not in spec.name.lower()
    return (8192 if online else 16384) if large else (2048 if online else 8192)


def simulated_engine(
    model: str | ModelConfig = "llama-3-8b",
    device: str | DeviceSpec = "h100",
    policy=None,
    config: EngineConfig | None = None,
    *,
    dtype: str | None = None,
    tp: int = 1,
    engine: str | EngineKind | None = None,
    kv_cache_dtype: str = "auto",
    acceptance=None,
    fast_forward: bool = True,
    **knobs,
) -> Engine:
    """An engine that simulates `model` (a name from costmodel.MODEL_SPECS or a config.json)
    on `device` (h100, h200, a100, l40s, l4, rtx4090, cpu).

    The KV cache gets the blocks that fit in the device memory left after the weights
    (`gpu_memory_utilization`, vLLM's knob) unless `num_blocks` or `kv_cache_bytes` is
    given. `dtype` defaults to the device's serving dtype (bfloat16 on GPUs). `engine` picks
    another kind of engine's step overhead (costmodel.ENGINE_KINDS: vllm, cpp, compiled,
    eager). The `quantization` knob (int8, fp8) is priced by the cost model, as is
    `kv_cache_dtype="fp8"` (vLLM's knob: one byte per K/V number, so twice the blocks fit).
    `acceptance` goes with a `speculative_config` knob: a per-token acceptance rate
    in [0, 1], or a Timeline of a measured run with speculation to replay (speculative.py).
    `fast_forward=False` runs every step through the scheduler (fastforward.py: the same timeline).
    Other keyword arguments are EngineConfig knobs (max_num_seqs, ...).
    """
    if policy is not None:
        knobs["policy"] = policy
    config = replace(config or EngineConfig(), **knobs)
    cost = CostModel(
        model,
        device,
        dtype=dtype,
        tp=tp,
        engine=engine,
        quantization=config.quantization,
        kv_cache_dtype=kv_cache_dtype,
    )
    # the speculation sizes the KV cache (a draft's weights and K/V), so it is made before
    # the builder resolves the knobs; the builder checks the rest (EngineConfig.resolve)
    speculative = SpeculativeConfig.of(config.speculative_config)
    speculation = make_speculation(speculative, cost, acceptance, config.seed)
    executor = SimulatedExecutor(cost, speculation)
    config = replace(config, dtype=cost.dtype, speculative_config=speculative)
    engine = SimulatedEngine(executor, config, clock=SimulatedClock(executor.step_time))
    engine.fast = fast_forward
    return engine
