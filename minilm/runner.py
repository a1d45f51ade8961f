"""From a step plan to tensors, and through the model.

`build_step_inputs` flattens a plan into one ragged batch (DESIGN.md "One engine
step"): token ids and positions of every new token, `cu_seqlens_q`, each sequence's
context length, the block tables and the slot mapping. Padding tokens of static
batching are real rows of this batch: they cost what a real token costs, and their
results are thrown away.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import get_backend
from .kv_cache import BlockAllocator
from .model import AttentionMetadata, LlamaModel
from .sampling import sample
from .scheduler import StepPlan


@dataclass
class StepInputs:
    input_ids: torch.Tensor   # [T]
    positions: torch.Tensor   # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] index in the flat batch of each sampling sequence's last token
    sample_ids: list[str]      # request id of each of those rows


def build_step_inputs(plan: StepPlan, allocator: BlockAllocator, pad_token_id: int,
                      device: str | torch.device = "cpu") -> StepInputs:
    ids, positions, slots, cu, ctx, tables, sample_rows, sample_ids = [], [], [], [0], [], [], [], []
    bs = allocator.block_size
    for w in plan.work:
        rid = w.request.request_id
        table = allocator.tables[rid]
        ids += w.request.token_ids(w.start, w.num_tokens) + [pad_token_id] * w.num_padding
        pos = range(w.start, w.end)
        positions += pos
        slots += [table[p // bs] * bs + p % bs for p in pos]
        if w.samples:
            sample_rows.append(cu[-1] + w.num_tokens - 1)
            sample_ids.append(rid)
        cu.append(cu[-1] + w.num_tokens + w.num_padding)
        ctx.append(w.end)
        tables.append(table)
    width = max((len(t) for t in tables), default=0)
    block_tables = [t + [0] * (width - len(t)) for t in tables]

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    meta = AttentionMetadata(cu_seqlens_q=i32(cu), context_lens=i32(ctx),
                             block_tables=i32(block_tables).reshape(len(tables), width),
                             slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device))
    return StepInputs(torch.tensor(ids, dtype=torch.int64, device=device),
                      torch.tensor(positions, dtype=torch.int64, device=device),
                      meta, torch.tensor(sample_rows, dtype=torch.int64, device=device), sample_ids)


class ModelExecutor:
    """Runs the real model on a plan and samples; owns the KV cache tensor."""

    kind = "model"

    def __init__(self, model: LlamaModel, kv_cache: torch.Tensor, allocator: BlockAllocator,
                 attention_backend: str, pad_token_id: int = 0):
        self.model = model
        self.kv_cache = kv_cache
        self.allocator = allocator
        self.attention, self.write_kv = get_backend(attention_backend)
        self.pad_token_id = pad_token_id
        self.device = kv_cache.device
        self.generators: dict[str, torch.Generator | None] = {}

    def execute(self, plan: StepPlan) -> dict[str, int]:
        if not plan.work:
            return {}
        inp = build_step_inputs(plan, self.allocator, self.pad_token_id, self.device)
        with torch.inference_mode():
            hidden = self.model(inp.input_ids, inp.positions, self.kv_cache, inp.meta,
                                self.attention, self.write_kv)
            if not inp.sample_ids:
                return {}
            logits = self.model.logits(hidden[inp.sample_rows])
        reqs = {w.request.request_id: w.request for w in plan.work}
        params = [reqs[rid].params for rid in inp.sample_ids]
        gens = [self.generator(reqs[rid]) for rid in inp.sample_ids]
        return dict(zip(inp.sample_ids, sample(logits, params, gens)))

    def generator(self, req) -> torch.Generator | None:
        rid = req.request_id
        if rid not in self.generators:
            seed = req.params.seed
            self.generators[rid] = None if seed is None else torch.Generator().manual_seed(seed)
        return self.generators[rid]

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
