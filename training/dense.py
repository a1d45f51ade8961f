"""The model's dense forward pass, for training: a batch of rows [B, L], each one sequence
from position 0, a plain causal mask, no KV cache.

The engine never needs this (minilm/model/llama.py runs one ragged batch over the paged
cache); training sees every position of every row at once. The weights are the same
modules, so a trained model loads into the engine as it is (tests/test_trained_model.py
checks that both paths give the same logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minilm.model.llama import Attention, LlamaModel, apply_rope, rope_cos_sin


def dense_attention(
    attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x [B, L, hidden] -> [B, L, hidden]: causal self-attention of each row."""
    B, L, _ = x.shape
    q = attn.q_proj(x).view(B, L, attn.num_heads, attn.head_dim)
    k = attn.k_proj(x).view(B, L, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(B, L, attn.num_kv_heads, attn.head_dim)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # cos/sin [L, 1, D] broadcast over B
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return attn.o_proj(out.transpose(1, 2).reshape(B, L, attn.num_heads * attn.head_dim))


def dense_logits(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, L, vocab] (float32) of a dense batch `input_ids [B, L]`."""
    cfg = model.config
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    x = model.model.embed_tokens(input_ids)
    for layer in model.model.layers:
        x = x + dense_attention(layer.self_attn, layer.input_layernorm(x), cos, sin)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x)).float()
