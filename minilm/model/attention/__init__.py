"""Attention backends, each two functions over one layer's cache ([num_blocks, block_size, Hkv, D]):

    write_kv(k [T,Hkv,D], v, k_cache, v_cache, slot_mapping [T]) -> None
    attention(q [T,Hq,D], k_cache, v_cache, meta, scale) -> out [T,Hq,D]

reference  readable pure torch, one sequence at a time: the ground truth (lesson 5)
sdpa       the same on CPU, faster: PyTorch's fused scaled_dot_product_attention
triton     the GPU kernel (on CPU only in Triton's interpreter, for tests)
"""

from __future__ import annotations

import importlib

from ...config import ATTENTION_BACKENDS, InvalidValue


def get_backend(name: str):
    """Returns (attention, write_kv) for a backend name."""
    if name not in ATTENTION_BACKENDS:
        raise InvalidValue("attention_backend", name, f"allowed: {', '.join(ATTENTION_BACKENDS)}")
    try:
        backend = importlib.import_module(
            f".{'triton_paged' if name == 'triton' else name}", __name__
        )
    except ImportError as e:  # Triton has wheels for Linux only (a Mac has none)
        raise InvalidValue(
            "attention_backend",
            name,
            f"needs {e.name}, which is not installed here; allowed here: reference, sdpa",
        ) from None
    return backend.paged_attention, backend.write_kv
