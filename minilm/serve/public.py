"""What the room may see of a run: the public view of timeline records (GET /timeline; lesson 9).

A server's public timeline feeds the live views (the live Gantt, the step view): lengths,
times, finish reasons, preemptions and block counts. Never token ids (the public tokenizer
turns them back into text), block tables or cached blocks (two requests holding the same
block began with the same prompt tokens). A field added to a record stays out of the
public view until it is named here (tests/test_room.py checks that every field is decided).
The whole run, tokens and block tables included, is in the engine's `--timeline FILE`.
"""

from __future__ import annotations

from typing import Any

from ..timeline import RequestRecord, StepItem, StepRecord

PUBLIC_FIELDS: dict[type, tuple[str, ...]] = {
    StepItem: ("request_id", "kind", "num_tokens", "context_len", "num_draft", "num_accepted"),
    StepRecord: (
        "step",
        "t_start",
        "t_end",
        "items",
        "num_running",
        "num_waiting",
        "kv_blocks_used",
        "kv_blocks_total",
        "num_preempted",
        "kv_tokens_stored",
        "model_time",
        "draft_time",
    ),
    RequestRecord: (
        "request_id",
        "arrival",
        "prompt_len",
        "max_tokens",
        "t_scheduled",
        "t_first_token",
        "token_times",
        "t_finished",
        "output_len",
        "finish_reason",
        "preemptions",
        "num_cached_tokens",
        "worst_gap",  # record="aggregate"'s stand-in for token_times: timing, as they are
    ),
}


def public_view(record: StepItem | StepRecord | RequestRecord) -> dict[str, Any]:
    """A record as the room may see it: its PUBLIC_FIELDS only, as JSON-ready values
    (`Timeline.from_dict` reads them back, the private fields at their defaults). The
    request ids are the rows' labels: the server names requests so that they may be shown
    (server.py `request_id`)."""
    view = {name: getattr(record, name) for name in PUBLIC_FIELDS[type(record)]}
    if isinstance(record, StepRecord):
        view["items"] = [public_view(item) for item in record.items]
    return view
