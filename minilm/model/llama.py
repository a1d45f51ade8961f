"""A Llama-family decoder over one flat, ragged batch of tokens.

There is no batch dimension: a step's tokens from every sequence are concatenated into
`input_ids [T]`, and `AttentionMetadata` says which sequence each belongs to and where
its K/V live in the paged cache (lesson 5). Everything but attention is per-token, so
it runs on the flat batch as on one long sequence.

Parameter names are Hugging Face's (`LlamaForCausalLM`, `Qwen2ForCausalLM`): a
`state_dict` loads from and saves to an HF checkpoint unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig


@dataclass
class AttentionMetadata:
    """Where each token of the flat batch belongs (built by `runner.py`; lesson 5).

    cu_seqlens_q  [B+1]  token offsets of each sequence's new tokens in the flat batch
    context_lens  [B]    tokens each sequence attends to: cached before this step + new
    block_tables  [B, max_blocks]  KV-cache block ids of each sequence, in order
    slot_mapping  [T]    flat cache slot (block * block_size + offset) of each new token
    """

    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    # The first two as lists, for backends that plan on the host: reading a GPU tensor back
    # would wait for every kernel queued before it.
    cu_seqlens_q_host: list[int] | None = None
    context_lens_host: list[int] | None = None
    scratch: dict = field(default_factory=dict)  # a backend's layout, kept for its other layers

    def host_layout(self) -> tuple[list[int], list[int]]:
        """The host lists: the runner's, or read back once (metadata built by hand)."""
        if self.cu_seqlens_q_host is not None and self.context_lens_host is not None:
            return self.cu_seqlens_q_host, self.context_lens_host
        if "host" not in self.scratch:
            self.scratch["host"] = self.cu_seqlens_q.tolist(), self.context_lens.tolist()
        return self.scratch["host"]


def cache_slots(
    block_tables: torch.Tensor, rows: torch.Tensor | int, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Flat cache slot (block * block_size + offset) of each of `positions` of the sequences in
    `rows` of `block_tables` (the runner's slot mapping, sdpa.py's gathers)."""
    blocks = block_tables[rows, positions // block_size].long()
    return blocks * block_size + positions % block_size


AttentionFn = Callable[..., torch.Tensor]  # attention/__init__.py
WriteKVFn = Callable[..., None]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / sqrt(mean(x^2) + eps), in float32 like HF, then cast back and scaled
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding angles for each token's own position (not its index in the batch)."""
    dims = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / theta ** (dims / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    # HF's "rotate_half" layout; the sin of the first half carries rotate_half's minus sign
    cos = torch.cat([angles, angles], dim=-1).cos()
    sin = torch.cat([-angles, angles], dim=-1).sin()
    return cos[:, None, :], sin[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, 1, D] (from `rope_cos_sin`): x*cos + rotate_half(x)*sin, where
    rotate_half(x) = [-x2, x1] for x = [x1, x2]."""
    half = x.shape[-1] // 2
    return (x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, bias = cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x,
        cos,
        sin,
        k_cache,
        v_cache,
        meta: AttentionMetadata,
        attention: AttentionFn,
        write_kv: WriteKVFn,
    ) -> torch.Tensor:
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # New K/V go into the cache first, so attention reads every key from one place
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = attention(q, k_cache, v_cache, meta, self.head_dim**-0.5)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, meta, attention, write_kv):
        x = x + self.self_attn(
            self.input_layernorm(x), cos, sin, k_cache, v_cache, meta, attention, write_kv
        )
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_random(self, seed: int, std: float = 0.02) -> LlamaModel:
        """Deterministic random weights (the same on every machine for a given seed)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):  # every RMSNorm's
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionFn,
        write_kv: WriteKVFn,
    ) -> torch.Tensor:
        """Hidden states [T, hidden]; `kv_cache` is [layers, 2, blocks, block_size, Hkv, D]."""
        cfg = self.config
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, kv_cache[i, 0], kv_cache[i, 1], meta, attention, write_kv)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the rows given: the runner's are the rows it samples."""
        return self.lm_head(hidden).float()
