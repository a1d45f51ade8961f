"""Writing HF-format checkpoints (`config.json` + `model.safetensors` with HF's parameter
names), which `minilm.model.loader` loads and `transformers` reads too. The engine only
loads checkpoints; what writes them lives here, with the trainer (and the tests that
make small checkpoints of their own).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from minilm.config import ModelConfig
from minilm.model.llama import LlamaModel
from minilm.model.loader import expected_shapes, resolve_dtype

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """The model's `config.json`, as Hugging Face writes it."""
    return asdict(config) | {
        "architectures": [ARCHITECTURES[config.model_type]],
        "hidden_act": "silu",
    }


def save_checkpoint(
    model: LlamaModel,
    path: str | Path,
    dtype: str = "float32",
    tokenizer_file: str | Path | None = None,
) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(hf_config(model.config) | {"torch_dtype": dtype}, indent=2)
    )
    tensors = {
        k: v.detach().to(resolve_dtype(dtype)).contiguous().cpu()
        for k, v in model.state_dict().items()
        if k in expected_shapes(model)
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_file is not None:
        (path / "tokenizer.json").write_bytes(Path(tokenizer_file).read_bytes())
    return path
