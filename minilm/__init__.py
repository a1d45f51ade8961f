"""minilm: a compact LLM inference engine for learning how serving engines batch requests.

The layers, bottom up (docs/DESIGN.md): the contracts (config, request, plan, timeline;
workload and metrics beside them), `model/` (the model and its execution), `core/` (the
engine loop, scheduler, policies, KV cache), `sim/` (the simulator), `serve/` (HTTP),
and the command line (cli.py).
"""

from .config import MODEL_PRESETS, EngineConfig, ModelConfig
from .core.engine import Engine, run_workload
from .metrics import items_df, requests_df, steps_df, summarize
from .timeline import Timeline
from .workload import RequestSpec, get_workload, make_workload

__all__ = [
    "Engine",
    "EngineConfig",
    "ModelConfig",
    "MODEL_PRESETS",
    "RequestSpec",
    "Timeline",
    "get_workload",
    "items_df",
    "make_workload",
    "requests_df",
    "run_workload",
    "steps_df",
    "summarize",
]
