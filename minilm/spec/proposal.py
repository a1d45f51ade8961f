"""What a proposer is asked for each sequence that sampled in a step."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Proposal:
    request_id: str
    token_ids: list[int]    # the sequence so far: prompt, output and the tokens this step kept
    num_drafts: int         # propose at most this many (fewer than the request may still produce)
    block_table: list[int]  # its KV blocks, with room for the drafts' K/V (core/step.py, lookahead)
