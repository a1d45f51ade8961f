"""The engine thread's hand-over logic, stepped by hand (no thread, no HTTP): every accepted
request gets its tokens exactly once and exactly one finish; aborts free KV at once."""
from __future__ import annotations

from helpers import engine as micro_engine
from minilm.serve.engine_thread import Abort, Accepted, Add, EngineThread, Rejected, RequestStream, Tokens
from minilm.serve.openai_api import COMPLETIONS, GenerateRequest


class RecordingLoop:
    """Stands in for the event loop: keeps what the engine thread hands over."""

    def __init__(self):
        self.events: list[tuple[str, object]] = []

    def call_soon_threadsafe(self, fn, events):
        self.events += [(stream.request_id, event) for stream, event in events]


def run(thread: EngineThread) -> None:
    while thread.engine.has_unfinished():
        thread.publish(thread.engine.step())


def add(thread: EngineThread, rid: str, max_tokens: int, prompt=(1, 2, 3)) -> RequestStream:
    request = GenerateRequest(COMPLETIONS, list(prompt), max_tokens, {"ignore_eos": True})
    stream = RequestStream(rid)
    thread.apply(Add(stream, request, thread.engine.clock.now))
    return stream


def test_tokens_once_each_and_one_finish_per_request_with_a_stream_interval():
    loop = RecordingLoop()
    thread = EngineThread(micro_engine(max_num_seqs=2), loop, stream_interval=4)
    for rid, n in (("a", 10), ("b", 3), ("c", 1)):
        add(thread, rid, n)
    run(thread)
    for rid, n in (("a", 10), ("b", 3), ("c", 1)):
        events = [e for r, e in loop.events if r == rid]
        assert isinstance(events[0], Accepted) and events[0].prompt_len == 3
        tokens = [e for e in events if isinstance(e, Tokens)]
        assert sum((e.token_ids for e in tokens), []) == thread.engine.requests[rid].output_ids
        assert [e.finish_reason for e in tokens] == [None] * (len(tokens) - 1) + ["length"]
    sizes = [len(e.token_ids) for r, e in loop.events if r == "a" and isinstance(e, Tokens)]
    assert sizes == [1, 4, 4, 1]  # the first token at once, then every 4th, and the rest at the finish
    assert not thread.streams


def test_abort_frees_kv_and_finishes_once_and_a_full_queue_refuses():
    loop = RecordingLoop()
    engine = micro_engine(max_num_seqs=1)
    thread = EngineThread(engine, loop, max_waiting=1)
    a = add(thread, "a", 50)
    thread.publish(engine.step())  # a runs
    duplicate = add(thread, "a", 5)  # refused (its id is taken): aborting it must not touch the original
    thread.apply(Abort(duplicate))
    assert not engine.requests["a"].finished
    add(thread, "b", 5)            # waits (1 waiting: the limit)
    add(thread, "c", 5)            # refused: 429
    assert [type(e).__name__ for r, e in loop.events if r == "c"] == ["Rejected"]
    assert [e.error.status for r, e in loop.events if r == "c"] == [429]
    thread.apply(Abort(a))
    thread.apply(Abort(a))  # a second abort of the same request does nothing
    assert [e.finish_reason for r, e in loop.events if r == "a" and isinstance(e, Tokens)][-1] == "aborted"
    assert sum(e.finish_reason == "aborted" for r, e in loop.events if r == "a" and isinstance(e, Tokens)) == 1
    assert "a" not in engine.kv_manager.block_tables
    run(thread)
    assert [r.request_id for r in engine.timeline.requests] == ["a", "b"]
    assert [r.finish_reason for r in engine.timeline.requests] == ["aborted", "length"]
    add(thread, "a", 5)  # ids stay taken: the engine's own check, a 400
    assert [e.error.status for r, e in loop.events if r == "a" and isinstance(e, Rejected)] == [400, 400]
