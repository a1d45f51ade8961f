"""What a proposer is asked for each sequence that sampled in a step, and how many drafts to ask for."""

from __future__ import annotations

from dataclasses import dataclass

from ..request import Request


@dataclass
class Proposal:
    request_id: str
    token_ids: list[int]  # the sequence so far: prompt, output and the tokens this step kept
    num_drafts: int  # propose at most this many (fewer than the request may still produce)
    block_table: list[int]  # its KV blocks, with room for the drafts' K/V (core/step.py, lookahead)


def max_drafts(k: int, req: Request, num_kept: int) -> int:
    """Drafts worth proposing for `req` after a step kept `num_kept` of its tokens (not yet appended):
    at most k, and fewer than it may still produce, since a draft past its last token could never
    be kept (0 or less: propose none). The real executor and the simulator both ask this."""
    return min(k, req.params.max_tokens - len(req.output_ids) - num_kept - 1)
