"""Attention backends. Every backend has the same two functions:

    write_kv(k [T,Hkv,D], v, k_cache, v_cache, slot_mapping [T]) -> None
    attention(q [T,Hq,D], k_cache, v_cache, meta, scale) -> out [T,Hq,D]

`k_cache`/`v_cache` are one layer's cache, [num_blocks, block_size, Hkv, D].

reference  readable pure torch: the ground truth and the code the lessons read
sdpa       the same on CPU, faster: PyTorch's fused scaled_dot_product_attention
triton     the GPU kernel (runs on CPU only in Triton's interpreter, for tests)
"""
from __future__ import annotations

from . import reference

BACKENDS = ("reference", "sdpa", "triton")


def get_backend(name: str):
    """Returns (attention, write_kv) for a backend name."""
    if name == "reference":
        return reference.paged_attention, reference.write_kv
    if name == "sdpa":
        from . import sdpa

        return sdpa.paged_attention, sdpa.write_kv
    if name == "triton":
        from . import triton_paged

        return triton_paged.paged_attention, triton_paged.write_kv
    raise ValueError(f"attention_backend={name!r}; allowed: {', '.join(BACKENDS)}")
