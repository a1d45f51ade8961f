"""Turning logits into tokens: greedy, temperature, top-k, top-p. A request with a seed
draws from its own generator, so what it samples does not depend on its batch-mates.
"""
from __future__ import annotations

import torch

from ..request import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the top-p nucleus. logits: [V]."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first is always kept)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of `logits` [B, V]."""
    tokens = logits.argmax(-1).tolist()
    for i, p in enumerate(params):
        if p.temperature == 0:
            continue
        row = filter_logits(logits[i].float() / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1).cpu()
        tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return tokens


def token_logprobs(logits: torch.Tensor, num_top: list[int | None]) -> list:
    """Per row, None (no log-probabilities asked) or a function of the sampled token that gives
    [its logprob, [[id, logprob] of the `num_top` most likely tokens]]."""
    if all(n is None for n in num_top):
        return [None] * len(num_top)
    logp = logits.float().log_softmax(-1).cpu()

    def of_row(row: torch.Tensor, n: int):
        top = torch.topk(row, n) if n else None
        best = [[int(t), float(v)] for t, v in zip(top.indices, top.values)] if n else []
        return lambda token: [float(row[token]), best]
    return [None if n is None else of_row(logp[i], n) for i, n in enumerate(num_top)]
