"""N-gram proposals (vLLM's `ngram` method, from "prompt lookup decoding"): text often repeats
itself (a name, a code identifier, a quoted phrase), so the tokens that followed the last few
tokens the last time they appeared are a free guess at what comes next. No model runs.
"""

from __future__ import annotations

import torch

from .config import SpeculativeConfig
from .proposal import Proposal


def prompt_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to `k` tokens that followed the earliest earlier occurrence of the longest suffix of
    `tokens` that is `min_n` to `max_n` tokens long; [] when no such suffix occurred before."""
    t = torch.tensor(tokens)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        # every n-gram that ends before the last token, so a token follows it
        hits = (t[:-1].unfold(0, n, 1) == t[-n:]).all(1).nonzero()
        if len(hits):
            start = int(hits[0]) + n
            return tokens[start : start + k]
    return []


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, proposals: list[Proposal]) -> dict[str, list[int]]:
        return {
            p.request_id: drafts
            for p in proposals
            if (drafts := prompt_lookup(p.token_ids, p.num_drafts, self.min_n, self.max_n))
        }

    def forget(self, request_id: str) -> None:
        pass
