"""The model runner: from a step plan to tensors, through the model, to sampled tokens.

It owns the KV cache tensor, whose blocks the KV cache manager (core/kv_cache.py) hands
out. `build_step_inputs` flattens a plan into one ragged batch (docs/DESIGN.md, "One
step"); static batching's padding tokens are real rows of it: they cost what a real
token costs, and their results are thrown away.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import EngineConfig, ModelConfig
from ..plan import ModelOutput, StepPlan
from .attention import get_backend
from .llama import AttentionMetadata, LlamaModel
from .loader import resolve_dtype
from .quantization import weight_bytes
from .sampling import sample, token_logprobs


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """[layers, 2 (K,V), num_blocks, block_size, Hkv, D], vLLM's per-layer layout."""
    return torch.zeros(model.num_hidden_layers, 2, num_blocks, block_size,
                       model.num_key_value_heads, model.head_dim, dtype=dtype, device=device)


def slot_mapping(block_tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Flat cache slot (block * block_size + offset) of token t, at `positions[t]` of the
    sequence in row `rows[t]` of `block_tables [B, max_blocks]`."""
    blocks = block_tables[rows, positions // block_size].long()
    return blocks * block_size + positions % block_size


@dataclass
class StepInputs:
    input_ids: torch.Tensor    # [T]
    positions: torch.Tensor    # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] index in the flat batch of each sampling sequence's last token
    sample_work: list          # the SeqWork of each of those rows


def build_step_inputs(plan: StepPlan, block_size: int, pad_token_id: int,
                      device: str | torch.device = "cpu") -> StepInputs:
    ids, starts, lens, ctx, tables, sample_rows, sample_work = [], [], [], [], [], [], []
    num_tokens = 0
    for w in plan.work:
        ids += w.request.token_ids(w.start, w.num_new_tokens)
        ids += [pad_token_id] * w.num_padding
        n = w.num_new_tokens + w.num_padding
        if w.samples:
            sample_rows.append(num_tokens + w.num_new_tokens - 1)
            sample_work.append(w)
        starts.append(w.start)
        lens.append(n)
        ctx.append(w.end)
        tables.append(w.block_table)
        num_tokens += n
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q_lens = torch.tensor(lens)
    # each token's row (sequence) and its position in that sequence
    rows = torch.repeat_interleave(torch.arange(len(lens)), q_lens)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
    torch.cumsum(q_lens, 0, out=cu[1:])
    positions = torch.tensor(starts)[rows] + torch.arange(num_tokens) - cu[rows]
    meta = AttentionMetadata(cu_seqlens_q=cu.to(device, torch.int32),
                             context_lens=torch.tensor(ctx, dtype=torch.int32, device=device),
                             block_tables=block_tables.to(device),
                             slot_mapping=slot_mapping(block_tables, rows, positions, block_size).to(device))
    return StepInputs(torch.tensor(ids, device=device), positions.to(device), meta,
                      torch.tensor(sample_rows, device=device), sample_work)


class ModelRunner:
    """Runs the real model on a plan and samples; owns the KV cache tensor."""

    kind = "model"

    def __init__(self, model: LlamaModel, config: EngineConfig, name: str, pad_token_id: int = 0):
        """`config`: resolved (num_blocks, attention_backend set: core/builder.py)."""
        self.model, self.model_config = model, model.config
        self.kv_cache = allocate_kv_cache(model.config, config.num_blocks, config.block_size,
                                          resolve_dtype(config.dtype), config.device)
        self.block_size = config.block_size
        self.backend = config.attention_backend
        self.attention, self.write_kv = get_backend(self.backend)
        self.name, self.pad_token_id, self.quantization = name, pad_token_id, config.quantization
        self.device = self.kv_cache.device
        self.generators: dict[str, torch.Generator | None] = {}

    def describe(self) -> dict:
        return {"model": self.name, "backend": self.backend, "device": str(self.device),
                "dtype": str(self.kv_cache.dtype).removeprefix("torch."), "quantization": self.quantization,
                "weight_bytes": weight_bytes(self.model)}

    def execute(self, plan: StepPlan) -> ModelOutput:
        """The next token of every sequence that samples in this step."""
        inp = build_step_inputs(plan, self.block_size, self.pad_token_id, self.device)
        with torch.inference_mode():
            hidden = self.model(inp.input_ids, inp.positions, self.kv_cache, inp.meta,
                                self.attention, self.write_kv)
            if not inp.sample_work:
                return ModelOutput({})
            logits = self.model.logits(hidden[inp.sample_rows])
        reqs = [w.request for w in inp.sample_work]
        logprobs = token_logprobs(logits, [r.params.logprobs for r in reqs])  # raw, as vLLM's: before any mask
        for i, r in enumerate(reqs):  # min_tokens: no end (EOS, a stop id) yet
            if len(r.output_ids) < r.params.min_tokens:
                logits[i, [t for t in (r.eos_token_id, *r.params.stop_token_ids) if t is not None]] = float("-inf")
        tokens = sample(logits, [r.params for r in reqs], [self.generator(r) for r in reqs])
        return ModelOutput({r.request_id: [t] for r, t in zip(reqs, tokens)},
                           {r.request_id: [lp(t)] for r, lp, t in zip(reqs, logprobs, tokens) if lp})

    def generator(self, req) -> torch.Generator | None:
        """A seeded request's own generator (sampling.py says why)."""
        rid = req.request_id
        if rid not in self.generators:
            seed = req.params.seed
            self.generators[rid] = None if seed is None else torch.Generator().manual_seed(seed)
        return self.generators[rid]

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
