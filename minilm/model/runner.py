"""The model runner: from a step plan to tensors, through the model, to sampled tokens.

It owns the KV cache tensor, whose blocks core/kv_cache.py hands out. Static batching's
padding tokens are real rows of the batch: they cost what a real token costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate

import torch

from ..config import EngineConfig, ModelConfig
from ..plan import ModelOutput, NewRequest, StepPlan
from .attention import get_backend
from .llama import AttentionMetadata, LlamaModel, cache_slots
from .loader import resolve_dtype
from .quantization import weight_bytes
from .sampling import sample


def allocate_kv_cache(
    model: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> torch.Tensor:
    """[layers, 2 (K,V), num_blocks, block_size, Hkv, D], vLLM's per-layer layout."""
    return torch.zeros(
        model.num_hidden_layers,
        2,
        num_blocks,
        block_size,
        model.num_key_value_heads,
        model.head_dim,
        dtype=dtype,
        device=device,
    )


def device_time(device_type: str) -> float:
    """time.perf_counter() once the device has done its queued work (a GPU runs ahead)."""
    if device_type in ("cuda", "mps"):
        getattr(torch, device_type).synchronize()
    return time.perf_counter()


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] the tokens after which a token is sampled
    sample_work: list  # each sampling SeqWork, 1 + its drafts rows, in order


def ragged_batch(
    seqs: list[tuple[list[int], int, list[int]]],
    block_size: int,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """(input_ids, positions, metadata) of one flat batch, from (token ids, position of the
    first, block table) of each sequence; the metadata keeps its host lists too."""
    lens = [len(ids) for ids, _, _ in seqs]
    cu = [0, *accumulate(lens)]
    context_lens = [start + n for (_, start, _), n in zip(seqs, lens)]
    width = max(len(table) for _, _, table in seqs)
    block_tables = torch.tensor(
        [table + [0] * (width - len(table)) for _, _, table in seqs], dtype=torch.int32
    )
    # each token's row (sequence) and its position in that sequence
    rows = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    starts = torch.tensor([start for _, start, _ in seqs])
    positions = starts[rows] + torch.arange(cu[-1]) - torch.tensor(cu)[rows]
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        slot_mapping=cache_slots(block_tables, rows, positions, block_size).to(device),
        cu_seqlens_q_host=cu,
        context_lens_host=context_lens,
    )
    input_ids = torch.tensor([t for ids, _, _ in seqs for t in ids], device=device)
    return input_ids, positions.to(device), meta


def build_step_inputs(
    plan: StepPlan, block_size: int, pad_token_id: int, device: str | torch.device = "cpu"
) -> StepInputs:
    """The plan's ragged batch. A sampling sequence is sampled after its last known token
    and after each of its drafts (lesson 10)."""
    seqs, sample_rows, sample_work = [], [], []
    num_tokens = 0
    for w in plan.work:
        known = len(w.token_ids)
        ids = w.token_ids + w.draft_token_ids + [pad_token_id] * w.num_padding
        if w.samples:
            sample_rows += range(num_tokens + known - 1, num_tokens + w.num_new_tokens)
            sample_work.append(w)
        seqs.append((ids, w.start, w.block_table))
        num_tokens += len(ids)
    input_ids, positions, meta = ragged_batch(seqs, block_size, device)
    return StepInputs(
        input_ids, positions, meta, torch.tensor(sample_rows, device=device), sample_work
    )


@dataclass(slots=True)
class CachedRequest:
    """The runner's own copy of a request (vLLM's CachedRequestState)."""

    new: NewRequest
    token_ids: list[int]  # the sequence so far: prompt, then each token kept
    generator: torch.Generator | None  # a seeded request's own (sampling.py)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - len(self.new.prompt_ids)


class ModelRunner:
    """Runs the real model on a plan and samples; owns the KV cache tensor."""

    kind, speculates = "model", False

    def __init__(self, model: LlamaModel, config: EngineConfig, name: str, pad_token_id: int = 0):
        self.model, self.model_config = model, model.config
        self.kv_cache = allocate_kv_cache(
            model.config,
            config.num_blocks,
            config.block_size,
            resolve_dtype(config.dtype),
            config.device,
        )
        self.block_size = config.block_size
        self.backend = config.attention_backend
        self.attention, self.write_kv = get_backend(self.backend)
        self.name, self.pad_token_id, self.quantization = name, pad_token_id, config.quantization
        self.device = self.kv_cache.device
        self.requests: dict[str, CachedRequest] = {}

    def describe(self) -> dict:
        return {
            "model": self.name,
            "backend": self.backend,
            "device": str(self.device),
            "dtype": str(self.kv_cache.dtype).removeprefix("torch."),
            "quantization": self.quantization,
            "weight_bytes": weight_bytes(self.model),
        }

    def execute(self, plan: StepPlan) -> ModelOutput:
        """The tokens each sequence that samples keeps: its accepted drafts, then one of the
        target's own."""
        for w in plan.work:
            if w.new is not None:
                seed = w.new.params.seed
                gen = None if seed is None else torch.Generator().manual_seed(seed)
                self.requests[w.request_id] = CachedRequest(w.new, list(w.new.prompt_ids), gen)
        inp = build_step_inputs(plan, self.block_size, self.pad_token_id, self.device)
        with torch.inference_mode():
            hidden = self.model(
                inp.input_ids, inp.positions, self.kv_cache, inp.meta, self.attention, self.write_kv
            )
            if not inp.sample_work:
                return ModelOutput({})
            logits = self.model.logits(hidden[inp.sample_rows])
        work = inp.sample_work
        reqs = [self.requests[w.request_id] for w in work]
        tokens, logprobs = sample(logits, reqs, [w.draft_token_ids for w in work])
        out = ModelOutput({})
        for w, r, kept, lps in zip(work, reqs, tokens, logprobs):
            r.token_ids += kept
            out.sampled_token_ids[w.request_id] = kept
            if lps is not None:
                out.logprobs[w.request_id] = lps
        return out

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
