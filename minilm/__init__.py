"""minilm: a compact LLM inference engine for learning how serving engines batch requests."""
from .config import EngineConfig, ModelConfig, MODEL_PRESETS
from .engine import Engine, run_workload
from .metrics import summarize
from .timeline import Timeline
from .workload import RequestSpec, get_workload, make_workload

__all__ = ["Engine", "EngineConfig", "ModelConfig", "MODEL_PRESETS", "RequestSpec", "Timeline",
           "get_workload", "make_workload", "run_workload", "summarize"]
