"""What a proposer is asked for each sequence that sampled in a step, and how many drafts to ask for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Proposal:
    request_id: str
    token_ids: list[int]  # the sequence so far: prompt, output and the tokens this step kept
    num_drafts: int  # propose at most this many (fewer than the request may still produce)
    block_table: list[int]  # its KV blocks, with room for the drafts' K/V (core/step.py, lookahead)


def max_drafts(k: int, num_left: int) -> int:
    """Drafts worth proposing for a request that may still produce `num_left` tokens: at most
    k, and fewer than that, since a draft past its last token could never be kept (0 or
    less: propose none). The real executor and the simulator both ask this."""
    return min(k, num_left - 1)
