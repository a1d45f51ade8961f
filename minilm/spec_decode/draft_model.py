"""A draft model (lesson 10): a small Llama with the target's tokenizer guesses k tokens one at a
time, greedily; the target then checks all k in one step. Its K/V live in a paged cache of its
own, indexed by the target's block tables (the step reserved `num_lookahead_tokens` slots past
each sampling sequence for the drafts), so it needs no allocator of its own.

Each step it first catches up: it runs every token of the sequence it has not seen (the
tokens the target kept, the last of which the target sampled itself), which also gives its
first guess; then k - 1 single-token steps. Its K/V of its own guesses are not trusted later:
the next catch-up starts after the tokens that were known, and overwrites them.
"""

from __future__ import annotations

import torch

from ..model.attention import get_backend
from ..model.llama import LlamaModel
from ..model.runner import allocate_kv_cache, ragged_batch
from .proposal import Proposal


class DraftModelProposer:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, attention_backend: str):
        weight = model.lm_head.weight
        self.model, self.block_size = model, block_size
        self.kv_cache = allocate_kv_cache(
            model.config, num_blocks, block_size, weight.dtype, weight.device
        )
        self.attention, self.write_kv = get_backend(attention_backend)
        self.num_computed: dict[
            str, int
        ] = {}  # tokens of each sequence whose draft K/V are in the cache

    def propose(self, proposals: list[Proposal]) -> dict[str, list[int]]:
        if not proposals:
            return {}
        starts = [self.num_computed.get(p.request_id, 0) for p in proposals]
        first = self.next_tokens(
            [(p.token_ids[s:], s, p.block_table) for p, s in zip(proposals, starts)]
        )
        drafts = {p.request_id: [t] for p, t in zip(proposals, first)}
        for p in proposals:
            self.num_computed[p.request_id] = len(p.token_ids)
        for i in range(1, max(p.num_drafts for p in proposals)):
            live = [p for p in proposals if p.num_drafts > i]
            guesses = self.next_tokens(
                [(drafts[p.request_id][-1:], len(p.token_ids) + i - 1, p.block_table) for p in live]
            )
            for p, t in zip(live, guesses):
                drafts[p.request_id].append(t)
        return drafts

    def next_tokens(self, seqs: list[tuple[list[int], int, list[int]]]) -> list[int]:
        """The draft's greedy next token after each sequence's new tokens (written to its cache)."""
        input_ids, positions, meta = ragged_batch(seqs, self.block_size, self.kv_cache.device)
        with torch.inference_mode():
            hidden = self.model(
                input_ids, positions, self.kv_cache, meta, self.attention, self.write_kv
            )
            last = meta.cu_seqlens_q[1:].long() - 1
            return self.model.logits(hidden[last]).argmax(-1).tolist()

    def forget(self, request_id: str) -> None:
        """A finished or preempted request: its blocks are gone, and with them its draft K/V."""
        self.num_computed.pop(request_id, None)
