"""The simulator: the engine's own scheduler, KV cache and timeline, with step times from a
roofline cost model of a named GPU instead of a model computation (lessons 1, 6, 7)."""

from .costmodel import CostModel
from .executor import SimulatedExecutor, simulated_engine, vllm_default_budget
from .spec_speedup import spec_speedup_table

__all__ = [
    "CostModel",
    "SimulatedExecutor",
    "simulated_engine",
    "spec_speedup_table",
    "vllm_default_budget",
]
