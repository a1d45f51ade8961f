"""Disaggregated prefill with a real KV transfer (minilm/serve/kv_transfer.py).

First in one process (the two engine loops, the link a ZeroMQ socket pair), then for real: a
prefill and a decode engine-core process behind one server, against one engine's outputs.
"""

from __future__ import annotations

import time

import msgspec
import pytest
import torch
import zmq

from minilm import Engine, EngineConfig
from minilm.config import InvalidValue
from minilm.core.clock import WallClock
from minilm.serve.kv_transfer import (
    ConsumerLoop,
    KVTransferConfig,
    ProducerLoop,
    kv_message,
    received_kv,
)
from minilm.serve.messages import Abort, Add, Tokens, decode_commands, encode

torch.set_num_threads(1)

PROMPTS = [list(range(5, 5 + n)) for n in (3, 17, 40, 16, 33)] + [
    [7] * 20 + [9, 10, 11],
    [7] * 20 + [12],
]  # the last two share a prefix (block_size 16)
MAX_TOKENS = [6, 9, 12, 5, 8, 7, 10]


def config(**knobs) -> EngineConfig:
    return EngineConfig(**{"max_num_seqs": 8, "block_size": 16, **knobs})


def one_engine(**knobs) -> list[list[int]]:
    """Every request's greedy output on one engine (the reference)."""
    engine = Engine("docstrings", config(**knobs))
    for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        engine.add_request(str(i), p, max_tokens=m, ignore_eos=True)
    tl = engine.run()
    return [r.output_ids for r in sorted(tl.requests, key=lambda r: int(r.request_id))]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return one_engine()


def add(key: int, n: int) -> Add:
    return Add(key, str(key), PROMPTS[n], MAX_TOKENS[n], {"ignore_eos": True}, time.perf_counter())


class Pair:
    """The two loops in this process; the link an inproc socket pair."""

    def __init__(self, prefill: EngineConfig, decode: EngineConfig):
        self.ctx = zmq.Context()
        push, self.pull = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        push.bind("inproc://kv")
        self.pull.connect("inproc://kv")
        self.p = ProducerLoop(Engine("docstrings", prefill, clock=WallClock()), push, None)
        self.d = ConsumerLoop(Engine("docstrings", decode, clock=WallClock()), None)
        self.tokens: dict[int, list[int]] = {}
        self.finish: dict[int, str] = {}

    def collect(self, events) -> None:
        for e in events:
            if isinstance(e, Tokens):
                self.tokens.setdefault(e.key, []).extend(e.token_ids)
                if e.finish_reason:
                    self.finish[e.key] = e.finish_reason

    def link(self) -> None:
        while self.pull.poll(0):
            for msg in decode_commands(self.pull.recv()):
                self.collect(self.d.apply(msg))

    def run(self) -> None:
        while self.p.engine.has_unfinished() or self.d.engine.has_unfinished() or self.d.held:
            if self.p.engine.has_unfinished():
                self.p.step()  # the prefill side's tokens are not the client's
            self.link()
            if self.d.engine.has_unfinished():
                self.collect(self.d.step())

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def test_message_round_trip_and_bad_messages():
    pair = Pair(config(), config())
    pair.p.apply(add(0, 2))
    while not pair.p.engine.requests["0"].output_ids:
        pair.p.engine.step()
    engine, req = pair.p.engine, pair.p.engine.requests["0"]
    msg = kv_message(engine, req, 0)
    back = decode_commands(encode([msg]))[0]
    assert (
        encode([back]) == encode([msg]) and len(msg.kv) == 6 * 2 * 3 * 16 * 2 * 32 * 4
    )  # 40 tokens: 3 blocks
    cache = pair.d.engine.executor.kv_cache
    kv = received_kv(back, req, cache, 16)
    table = engine.kv_manager.block_tables["0"]
    assert torch.equal(kv, engine.executor.kv_cache[:, :, table[:3]])
    for field, value, name in [
        ("kv", msg.kv[:-4], "kv"),
        ("block_hashes", [1, 2], "block_hashes"),
        ("dtype", "bfloat16", "dtype"),
        ("shape", [6, 2, 2, 16, 2, 32], "shape"),
    ]:
        with pytest.raises(InvalidValue) as e:
            received_kv(msgspec.structs.replace(msg, **{field: value}), req, cache, 16)
        assert e.value.name == name and "request '0'" in str(e.value)
    with pytest.raises(msgspec.DecodeError, match="malformed|truncated"):
        decode_commands(encode([msg])[:-10])
    with pytest.raises(InvalidValue, match="kv_role"):
        KVTransferConfig("kv_both")
    with pytest.raises(InvalidValue, match="kv_rank"):
        KVTransferConfig.parse('{"kv_role": "kv_producer", "kv_rank": 0}')
    pair.close()


@pytest.mark.parametrize(
    "decode_knobs",
    [
        {},  # room for everyone
        {"num_blocks": 5, "max_num_seqs": 3},  # full: requests wait with their KV held; preemption
    ],
    ids=["roomy", "few-blocks"],
)
def test_in_process_transfer_matches_one_engine(reference, decode_knobs):
    pair = Pair(
        config(enable_prefix_caching=True), config(enable_prefix_caching=True, **decode_knobs)
    )
    for i in range(len(PROMPTS) - 1):
        pair.p.apply(add(i, i))
    pair.run()
    pair.p.apply(add(6, 6))  # shares its first block with request 5, which has finished
    pair.run()
    assert [pair.tokens[i] for i in range(len(PROMPTS))] == reference
    assert set(pair.finish.values()) == {"length"}
    d, p = pair.d.engine, pair.p.engine
    assert d.kv_manager.num_free_blocks == d.config.num_blocks  # every block back
    assert p.kv_manager.num_free_blocks == p.config.num_blocks
    assert {r.finish_reason for r in p.timeline.requests} == {"transferred"}
    transfers = [s for s in d.timeline.steps if s.items[0].kind == "transfer"]
    assert len(transfers) == len(PROMPTS) and all(s.t_end >= s.t_start for s in transfers)
    # the shared prefix: both sides found it in their prefix cache
    assert [r.num_cached_tokens for r in p.timeline.requests if r.request_id == "6"] == [16]
    if not decode_knobs:
        assert pair.d.transfers[-1]["cached_blocks"] == 1
    if decode_knobs:
        assert max(x["held_s"] for x in pair.d.transfers) > 0
        assert sum(s.num_preempted for s in d.timeline.steps) > 0, "expected a preemption"
    pair.close()


def test_abort_while_held_frees_both_sides():
    pair = Pair(config(), config(num_blocks=4, max_num_seqs=1))
    for i in (2, 4):  # 40 and 33 tokens: 3 blocks each, so the second waits held
        pair.p.apply(add(i, i))
    for _ in range(4):
        pair.p.step()
        pair.link()
    assert len(pair.d.held) == 1 and pair.d.engine.num_running == 1
    pair.collect(pair.p.apply(Abort(4)))  # the client went away: to the prefill side ...
    pair.link()  # ... which passes it down the link, after the request's KV
    assert not pair.d.held and pair.finish[4] == "aborted"
    pair.collect(pair.d.apply(Abort(2)))
    assert pair.finish[2] == "aborted"
    for loop in (pair.p, pair.d):
        assert loop.engine.kv_manager.num_free_blocks == loop.engine.config.num_blocks
    pair.close()
