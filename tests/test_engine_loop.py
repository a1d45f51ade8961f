"""The engine's side of serving (minilm/serve/engine_loop.py), stepped by hand (no thread, no
process, no HTTP): every accepted request gets its tokens exactly once and exactly one finish;
aborts free KV at once; a refused duplicate never touches the request it collided with."""

from __future__ import annotations

from helpers import engine as micro_engine

from minilm.serve.engine_loop import EngineLoop
from minilm.serve.messages import Abort, Accepted, Add, Rejected, StepStats, Tokens

KEYS = iter(range(10**6))


def run(loop: EngineLoop) -> list:
    events = []
    while loop.engine.has_unfinished():
        events += loop.step()
    return events


def add(loop: EngineLoop, rid: str, max_tokens: int, prompt=(1, 2, 3)) -> tuple[int, list]:
    key = next(KEYS)
    return key, loop.apply(
        Add(key, rid, list(prompt), max_tokens, {"ignore_eos": True}, arrival=0.0)
    )


def of(events: list, key: int) -> list:
    return [e for e in events if not isinstance(e, StepStats) and e.key == key]


def test_tokens_once_each_and_one_finish_per_request_with_a_stream_interval():
    loop = EngineLoop(micro_engine(max_num_seqs=2), stream_interval=4)
    keys, events = {}, []
    for rid, n in (("a", 10), ("b", 3), ("c", 1)):
        keys[rid], accepted = add(loop, rid, n)
        events += accepted
    events += run(loop)
    for rid, n in (("a", 10), ("b", 3), ("c", 1)):
        mine = of(events, keys[rid])
        assert isinstance(mine[0], Accepted) and mine[0].prompt_len == 3
        tokens = [e for e in mine if isinstance(e, Tokens)]
        assert sum((e.token_ids for e in tokens), []) == loop.engine.requests[rid].output_ids
        assert [e.finish_reason for e in tokens] == [None] * (len(tokens) - 1) + ["length"]
    sizes = [len(e.token_ids) for e in of(events, keys["a"]) if isinstance(e, Tokens)]
    assert sizes == [
        1,
        4,
        4,
        1,
    ]  # the first token at once, then every 4th, and the rest at the finish
    assert not loop.request_ids
    stats = [e for e in events if isinstance(e, StepStats)]
    assert (
        sum(s.generation_tokens for s in stats) == 14
        and sorted(r for r, _ in sum((s.finished for s in stats), [])) == ["length"] * 3
    )


def test_abort_frees_kv_and_finishes_once_and_a_full_queue_refuses():
    engine = micro_engine(max_num_seqs=1)
    loop = EngineLoop(engine, max_waiting=1)
    a, _ = add(loop, "a", 50)
    loop.step()  # a runs
    duplicate, refused = add(
        loop, "a", 5
    )  # refused (its id is taken): aborting it must not touch the original
    assert (
        isinstance(refused[0], Rejected)
        and refused[0].status == 400
        and refused[0].param == "request_id"
    )
    assert loop.apply(Abort(duplicate)) == [] and not engine.requests["a"].finished
    add(loop, "b", 5)  # waits (1 waiting: the limit)
    c, full = add(loop, "c", 5)  # refused: 429
    assert [(type(e).__name__, e.status) for e in full] == [("Rejected", 429)]
    first = loop.apply(Abort(a))
    assert loop.apply(Abort(a)) == []  # a second abort of the same request does nothing
    assert [e.finish_reason for e in first if isinstance(e, Tokens)] == ["aborted"]
    assert "a" not in engine.kv_manager.block_tables
    run(loop)
    assert [r.request_id for r in engine.timeline.requests] == ["a", "b"]
    assert [r.finish_reason for r in engine.timeline.requests] == ["aborted", "length"]


def test_an_abort_for_a_stop_string_records_stop():
    """The HTTP side found a stop string: the engine stops the request and records "stop"."""
    engine = micro_engine()
    loop = EngineLoop(engine)
    key, _ = add(loop, "s", 40)
    loop.step()
    loop.step()
    events = loop.apply(Abort(key, reason="stop"))
    assert [e.finish_reason for e in events if isinstance(e, Tokens)] == ["stop"]
    assert (
        engine.timeline.requests[-1].finish_reason == "stop" and not engine.kv_manager.block_tables
    )


def test_with_speculation_a_step_hands_over_every_token_it_kept_and_its_drafts():
    """A step that kept drafts samples several tokens of one request: they go out together (at least
    `stream_interval` of them, the first at once), and the step's stats carry each verification."""
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }
    loop = EngineLoop(micro_engine(max_num_seqs=2, speculative_config=ngram), stream_interval=2)
    prompts = {"a": [9] * 20, "b": [5, 6, 7, 8] * 3}  # the micro model keeps some drafts on these
    keys = {rid: add(loop, rid, 24, prompt)[0] for rid, prompt in prompts.items()}
    events = run(loop)
    for rid, key in keys.items():
        sizes = [len(e.token_ids) for e in of(events, key)]
        assert (
            sum((e.token_ids for e in of(events, key)), []) == loop.engine.requests[rid].output_ids
        )
        assert sizes[0] >= 1 and all(n >= 2 for n in sizes[1:-1])
    steps, stats = loop.engine.timeline.steps, [e for e in events if isinstance(e, StepStats)]
    assert [s.drafts for s in stats] == [
        [(i.num_draft, i.num_accepted) for i in s.items if i.num_draft] for s in steps
    ]
    assert sum(a for s in stats for _, a in s.drafts) > 0  # some step kept a draft
    assert sum(s.generation_tokens for s in stats) == 48
