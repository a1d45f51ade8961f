"""8-bit weights through torchao: what `EngineConfig.quantization` (vLLM's knob) turns on.

int8 / fp8: each row of a linear layer's weight in one byte a number (int8, or FP8 e4m3)
with one float scale, dequantized inside the matmul (weight-only: a CPU has no 8-bit float
arithmetic). The q/k/v/o projections and the MLP are quantized: nearly all of a step's
FLOPs and weight bytes. The LM head is not (nor in vLLM's fp8): its rounding goes straight
into the logits, and here it is tied to the embedding, a lookup. Fewer bytes read per step
is the gain; on this CPU it is not faster (bench/quantization.py; lesson 10).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..quiet import quiet_torchao


def quantize(model: nn.Module, method: str | None) -> nn.Module:
    """A copy of `model` with its linear layers but lm_head quantized by `method` (None: `model`)."""
    if method is None:
        return model
    quiet_torchao()
    import torchao.quantization as ao  # noqa: PLC0415 (slow to import: only when asked for)

    config = {"int8": ao.Int8WeightOnlyConfig, "fp8": ao.Float8WeightOnlyConfig}[method]()
    model = copy.deepcopy(model)  # the caller's stays as it was (a lesson builds two engines)
    ao.quantize_(
        model, config, filter_fn=lambda m, name: isinstance(m, nn.Linear) and name != "lm_head"
    )
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters as stored, a tied one once (quantized: its data and scales)."""

    def nbytes(p: torch.Tensor) -> int:
        inner = p.__tensor_flatten__()[0] if hasattr(p, "__tensor_flatten__") else []
        return sum(getattr(p, name).nbytes for name in inner) or p.nbytes

    return sum(nbytes(p) for p in model.parameters())
