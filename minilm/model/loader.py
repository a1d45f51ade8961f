"""HF-format checkpoints (`config.json`, `*.safetensors`), or a preset's seeded random
weights. Every tensor's name and shape is checked before use: a broken checkpoint fails
with a message, not garbage.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ..config import MODEL_PRESETS, InvalidValue, ModelConfig
from .llama import LlamaModel

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CHECKPOINTS_DIR = Path(__file__).parents[1] / "checkpoints"  # minilm/checkpoints: shipped models


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise InvalidValue("dtype", name, f"allowed: {', '.join(DTYPES)}")
    return DTYPES[name]


def expected_shapes(model: LlamaModel) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes the checkpoint must provide (a tied lm_head is optional)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def read_tensors(path: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, each checked against its expected shape."""
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if not tensors:
        raise ValueError(f"{path}: no *.safetensors file")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(
            f"{path}: checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}"
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"{path}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                f"the config needs {shape}"
            )
    return tensors


def resolve_model_path(name_or_path: str | Path) -> Path | None:
    """The checkpoint directory of a path or a shipped name; None for a preset."""
    if str(name_or_path) in MODEL_PRESETS:
        return None
    p = Path(name_or_path)
    if (p / "config.json").exists():
        return p
    if (CHECKPOINTS_DIR / str(name_or_path) / "config.json").exists():
        return CHECKPOINTS_DIR / str(name_or_path)
    shipped = sorted(p.parent.name for p in CHECKPOINTS_DIR.glob("*/config.json"))
    raise InvalidValue(
        "model",
        str(name_or_path),
        f"not a preset ({', '.join(MODEL_PRESETS)}), a shipped "
        f"checkpoint ({', '.join(shipped) or 'none'}) or a directory with config.json",
    )


def load_model(
    name_or_path: str | Path = "tiny", device: str = "cpu", dtype: str = "float32", seed: int = 0
) -> LlamaModel:
    """A preset with random weights from `seed`, or an HF-format checkpoint directory."""
    path = resolve_model_path(name_or_path)
    if path is None:
        model = LlamaModel(MODEL_PRESETS[str(name_or_path)]).init_random(seed)
    else:
        model = LlamaModel(ModelConfig.from_json(path / "config.json"))
        expected = expected_shapes(model)
        tensors = read_tensors(path, expected)
        model.load_state_dict({k: tensors[k] for k in expected}, strict=False)
        if model.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=resolve_dtype(dtype)).eval()
