"""The paged KV cache: fixed-size blocks, a free list, a block table per request.

vLLM's idea (PagedAttention, SOSP'23): instead of reserving one contiguous region of
`max_len` slots per request, hand out `block_size`-token blocks as a sequence grows,
and give them back the moment it ends. Only a sequence's last block can have unused
slots. `reserved` mode does it the pre-paging way — a request gets blocks for its
whole maximum length when admitted — so lesson 4 can measure what paging saves.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import ModelConfig


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bytes_per_block(model: ModelConfig, block_size: int, dtype_bytes: int) -> int:
    """K and V of `block_size` tokens in every layer."""
    return 2 * model.num_hidden_layers * block_size * model.num_key_value_heads * model.head_dim * dtype_bytes


def num_blocks_for_budget(model: ModelConfig, block_size: int, dtype_bytes: int, kv_cache_bytes: int) -> int:
    n = kv_cache_bytes // bytes_per_block(model, block_size, dtype_bytes)
    if n < 1:
        raise ValueError(f"kv_cache_bytes={kv_cache_bytes} holds no block of "
                         f"{bytes_per_block(model, block_size, dtype_bytes)} bytes")
    return n


def allocate_kv_tensor(model: ModelConfig, num_blocks: int, block_size: int,
                       dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """[layers, 2 (K,V), num_blocks, block_size, Hkv, D], vLLM's per-layer layout."""
    return torch.zeros(model.num_hidden_layers, 2, num_blocks, block_size,
                       model.num_key_value_heads, model.head_dim, dtype=dtype, device=device)


@dataclass
class BlockAllocator:
    """Hands out block ids from a free list and keeps each request's block table."""

    num_blocks: int
    block_size: int
    free: list[int] = field(default_factory=list)
    tables: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"num_blocks={self.num_blocks} and block_size={self.block_size} must be >= 1")
        # popped from the end: block 0 is handed out first
        self.free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """Extra blocks `request_id` needs so that its table covers `num_tokens` slots."""
        have = len(self.tables.get(request_id, ()))
        return max(0, cdiv(num_tokens, self.block_size) - have)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        return self.blocks_needed(request_id, num_tokens) <= len(self.free)

    def allocate(self, request_id: str, num_tokens: int) -> None:
        """Grow `request_id`'s table to cover `num_tokens` slots; all or nothing."""
        need = self.blocks_needed(request_id, num_tokens)
        if need > len(self.free):
            raise RuntimeError(f"out of KV blocks: {request_id} needs {need}, {len(self.free)} free")
        table = self.tables.setdefault(request_id, [])
        table.extend(self.free.pop() for _ in range(need))

    def release(self, request_id: str) -> int:
        """Return all of `request_id`'s blocks to the free list; returns how many."""
        table = self.tables.pop(request_id, [])
        self.free.extend(reversed(table))
        return len(table)

    def slot(self, request_id: str, position: int) -> int:
        """Flat cache slot of token `position` of a request: block * block_size + offset."""
        table = self.tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size
