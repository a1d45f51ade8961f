"""Logits to tokens: greedy, temperature, top-k, top-p, and accepting drafts (lesson 10). A
seeded request draws from its own generator: its samples do not depend on its batch-mates.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from ..request import SamplingParams


def sample(logits: torch.Tensor, reqs: list, drafts: list[list[int]]) -> tuple[list, list]:
    """Each sequence's kept tokens from its rows (1 + its drafts), and their logprobs where
    asked. Greedy rows are read in one go (nano-vllm's way: a GPU waits at each read)."""
    counts = [1 + len(d) for d in drafts]
    rows = [(r, i) for r, n in zip(reqs, counts) for i in range(n)]  # i: its i-th new token
    # raw, as vLLM's: before any mask
    logprobs = token_logprobs(logits, [r.new.params.logprobs for r, _ in rows])
    for row, (r, i) in enumerate(rows):  # min_tokens: no end (EOS, a stop id) yet
        if r.num_output + i < r.new.params.min_tokens:
            ends = (r.new.eos_token_id, *r.new.params.stop_token_ids)
            logits[row, [t for t in ends if t is not None]] = float("-inf")
    best = [None] * len(reqs)
    if any(r.new.params.temperature == 0 for r in reqs):
        best = split_list(logits.argmax(-1).tolist(), counts)
    tokens = [
        accept(n, d, r.new.params, r.generator, b)
        for n, d, r, b in zip(logits.split(counts), drafts, reqs, best)
    ]
    lps = split_list(logprobs, counts)
    return tokens, [
        [lp(t) for lp, t in zip(fs, ts)] if fs[0] else None for fs, ts in zip(lps, tokens)
    ]


def split_list(items: list, counts: list[int]) -> list[list]:
    ends = list(accumulate(counts))
    return [items[e - n : e] for e, n in zip(ends, counts)]


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask to -inf the tokens outside the top-k and the top-p nucleus. logits: [V]."""
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


def accept(
    logits: torch.Tensor,
    draft: list[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    best: list[int] | None = None,
) -> list[int]:
    """The tokens one sequence keeps from the target's `logits [1 + d, V]` after its last known
    token and each of its `d` drafts (lesson 10). Greedy: drafts while each is the argmax
    (`best`, if read already), then the target's own. Sampling: rejection sampling (Leviathan
    et al. 2023; Chen et al. 2023) for one-hot drafts (n-gram, EAGLE): keep draft x with
    probability p(x), else draw from p without x; after d kept drafts, draw one more from p.
    Every kept token is then distributed exactly as the target's own sample."""
    if params.temperature == 0:
        best = logits.argmax(-1).tolist() if best is None else best
        n = next((i for i, x in enumerate(draft) if x != best[i]), len(draft))
        return draft[:n] + [best[n]]
    kept = []
    for i, x in enumerate(draft):
        p = target_probs(logits[i], params)
        if torch.rand(1, generator=generator).item() >= p[x]:
            p[x] = 0.0  # the residual max(0, p - q) for a one-hot q, renormalised by multinomial
            break
        kept.append(x)
    else:
        p = target_probs(logits[len(draft)], params)
    return kept + [int(torch.multinomial(p, 1, generator=generator).item())]


def target_probs(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """softmax(logits / temperature), top-k and top-p applied: what a request samples from."""
    logits = filter_logits(row.float() / params.temperature, params.top_k, params.top_p)
    return logits.softmax(-1).cpu()


def token_logprobs(logits: torch.Tensor, num_top: list[int | None]) -> list:
    """Per row, None (none asked) or a function of the sampled token that gives
    [its logprob, [[id, logprob] of the `num_top` most likely tokens]]."""
    if all(n is None for n in num_top):
        return [None] * len(num_top)
    logp = logits.float().log_softmax(-1).cpu()

    def of_row(row: torch.Tensor, n: int):
        top = torch.topk(row, n) if n else None
        best = [[int(t), float(v)] for t, v in zip(top.indices, top.values)] if n else []
        return lambda token: [float(row[token]), best]

    return [None if n is None else of_row(logp[i], n) for i, n in enumerate(num_top)]
