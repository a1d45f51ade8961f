"""Disaggregated prefill with a real KV transfer (minilm/serve/kv_transfer.py).

First in one process (the two engine loops, the link a ZeroMQ socket pair), then for real: a
prefill and a decode engine-core process behind one server, against one engine's outputs.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec
import pytest
import torch
import zmq
from serving import running

from minilm import Engine, EngineConfig
from minilm.config import InvalidValue
from minilm.core.clock import WallClock
from minilm.model.loader import resolve_model_path
from minilm.model.tokenizer import load_tokenizer
from minilm.serve.kv_transfer import (
    ConsumerLoop,
    DisaggEngineClient,
    KVTransferConfig,
    ProducerLoop,
    kv_message,
    link_options,
    received_kv,
)
from minilm.serve.messages import Abort, Add, Tokens, decode_commands, encode
from minilm.serve.metrics import ServerMetrics
from minilm.serve.server import create_app
from widgets.gantt import gantt_figure, gantt_segments

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
    with pytest.raises(InvalidValue, match="kv_rank=0: unknown key"):
        link_options('{"kv_rank": 0}')
    with pytest.raises(InvalidValue, match="kv_port=0"):
        link_options('{"kv_port": 0}')
    assert link_options('{"kv_connector": "ZmqConnector", "kv_port": 9}') == {"kv_port": 9}
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
    for tl in (p.timeline, d.timeline):  # the Gantt draws the transfers on both sides
        seg = gantt_segments(tl)
        assert sorted(seg[seg.kind == "transfer"].request_id) == [str(i) for i in range(7)]
        assert [len(t.y) for t in gantt_figure(tl).data if t.name == "transfer"] == [7]
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


# ---- real processes: a prefill and a decode engine core behind one server -----------------
def server(decode_knobs: dict, model: str = "docstrings"):
    """A server over a disaggregated pair, one CPU thread per engine core."""
    client = DisaggEngineClient(
        model,
        config(enable_prefix_caching=True, cpu_threads=1),
        config(enable_prefix_caching=True, cpu_threads=1, **decode_knobs),
        ServerMetrics(model, None),
    )
    tokenizer = load_tokenizer(resolve_model_path(model))
    return running(create_app(client, model, tokenizer)), client, tokenizer


def complete(h: httpx.Client, i: int) -> str:
    body = {"prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i], "temperature": 0, "ignore_eos": True}
    r = h.post("/v1/completions", json={"model": "docstrings", **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_server_outputs_match_one_engine(reference):
    """Few decode blocks: requests wait on the decode side with their KV held."""
    app, client, tokenizer = server({"num_blocks": 5, "max_num_seqs": 3})
    with app as url, httpx.Client(base_url=url, timeout=300) as h:

        async def all_at_once():
            return await asyncio.gather(
                *(asyncio.to_thread(complete, h, i) for i in range(len(PROMPTS) - 1))
            )

        texts = asyncio.run(all_at_once()) + [complete(h, 6)]  # 6 after 5: a prefix cache hit
        assert texts == [tokenizer.decode(ids) for ids in reference]
        data = h.get("/timeline").json()
        prefill = data["prefill"]
        assert (
            data["kv_free_blocks"] == 5
            and prefill["kv_free_blocks"] == prefill["meta"]["num_blocks"]
        )
        assert data["held"] == 0 and len(data["transfers"]) == len(PROMPTS)
        assert sum(t["bytes"] for t in prefill["transfers"]) == sum(
            t["bytes"] for t in data["transfers"]
        )
        # (whether it preempts depends on the timing here: test_server_decode_side_preempts... does)
        assert [
            r["num_cached_tokens"] for r in prefill["requests"] if r["request_id"].endswith("6")
        ]
        kinds = {i["kind"] for s in data["steps"] + prefill["steps"] for i in s["items"]}
        assert {"transfer", "prefill", "decode"} <= kinds


def test_server_abort_during_transfer_frees_both_sides():
    """The decode side has one seat: a second request waits there with its KV held; its client
    goes away; both sides' blocks come back. The seat's holder asks for more tokens than the
    test takes (the tiny model: 2,048 positions), so however loaded the machine, it still holds
    the seat when the second request arrives; its client leaves too, at the end."""
    app, client, tokenizer = server({"max_num_seqs": 1}, model="tiny")
    with app as url:
        long = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 2000, "stream": True}
        held = {"model": "tiny", "prompt": PROMPTS[2], "max_tokens": 5, "stream": True}

        async def first_token(lines) -> None:
            async for line in lines:
                if line.startswith("data:"):
                    return  # a first token: its KV has reached the decode side

        async def run():
            async with httpx.AsyncClient(base_url=url, timeout=300) as a:
                async with a.stream(
                    "POST", "/v1/completions", json={**long, "ignore_eos": True}
                ) as r1:
                    # the line iterators are kept: a dropped one is closed when the event loop
                    # gets to it, and its stream with it (the server aborts the request)
                    lines = r1.aiter_lines()
                    await first_token(lines)  # it holds the decode side's one seat
                    async with a.stream("POST", "/v1/completions", json=held) as r2:
                        lines2 = r2.aiter_lines()  # kept too: held open until the snapshot
                        await first_token(lines2)
                        snap = (await a.get("/timeline")).json()
                    # its stream is closed: the server aborts it, on both sides
                    after = await until_settled(a, lambda d: d["held"] == 0)
                # the long one's client leaves too
                done = await until_settled(
                    a,
                    lambda d: (
                        not d["unfinished"] and d["kv_free_blocks"] == d["meta"]["num_blocks"]
                    ),
                )
            return snap, after, done

        snap, after, done = asyncio.run(run())
        assert snap["held"] == 1, "the second request did not wait with its KV held"
        assert after["held"] == 0  # aborted while held: its KV dropped
        assert after["prefill"]["kv_free_blocks"] == after["prefill"]["meta"]["num_blocks"]
        assert done["kv_free_blocks"] == done["meta"]["num_blocks"]
        assert {r["finish_reason"] for r in done["prefill"]["requests"]} == {"transferred"}


async def until_settled(a: httpx.AsyncClient, settled, timeout: float = 60.0) -> dict:
    """GET /timeline until `settled(data)`: an abort is applied between two of a core's steps."""
    deadline = time.monotonic() + timeout
    while True:
        data = (await a.get("/timeline")).json()
        if settled(data) or time.monotonic() > deadline:
            return data
        await asyncio.sleep(0.05)


def test_serve_refuses_a_bad_kv_transfer_config(capsys):
    """Before any process starts: a bad key is named, with the keys the server takes."""
    from minilm.cli import main

    assert main(["serve", "--kv-transfer-config", '{"kv_role": "kv_producer"}']) == 2
    assert "kv_role='kv_producer': the server runs one core of each role" in capsys.readouterr().err
    args = ["serve", "--kv-transfer-config", "{}", "--data-parallel-size", "2"]
    assert main(args) == 2
    assert "data-parallel-size=2: a disaggregated pair" in capsys.readouterr().err


def test_server_decode_side_preempts_and_outputs_match():
    """Two received requests that outgrow the decode side's 4 blocks together: one is preempted
    there and recomputed from its tokens; both answers are one engine's."""
    prompts, max_tokens = [list(range(5, 21)), list(range(30, 46))], 40  # 16 + 40: 4 blocks each
    engine = Engine("docstrings", config())
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, max_tokens=max_tokens, ignore_eos=True)
    expected = [engine.tokenizer.decode(r.output_ids) for r in engine.run().requests]
    app, client, tokenizer = server({"num_blocks": 4, "max_num_seqs": 2})
    with app as url, httpx.Client(base_url=url, timeout=300) as h:

        def one(p: list[int]) -> str:
            body = {
                "model": "docstrings",
                "prompt": p,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            }
            return h.post("/v1/completions", json=body).json()["choices"][0]["text"]

        async def both():
            return await asyncio.gather(*(asyncio.to_thread(one, p) for p in prompts))

        assert sorted(asyncio.run(both())) == sorted(expected)
        data = h.get("/timeline").json()
        assert sum(s["num_preempted"] for s in data["steps"]) > 0, "expected a preemption"
        assert data["kv_free_blocks"] == 4


def test_a_request_begins_with_accepted_when_the_api_process_falls_behind():
    """The two cores' events come on two sockets. While this process is stalled (time.sleep in
    its event loop, as a loaded machine deschedules it), the decode core's socket has something
    to read first (a snapshot's answer), then the prefill core's Accepted comes and, after the
    transfer, the decode core's tokens. The decode socket's reader takes all it holds without
    yielding: unordered, a stream began with a token (the server answered 500) and its Accepted
    came after its end. Three requests, one after the other (the first one's order varies)."""
    from minilm.serve.kv_transfer import DECODE
    from minilm.serve.messages import Snapshot
    from minilm.serve.openai_api import COMPLETIONS, GenerateRequest

    async def run() -> list[list]:
        client = DisaggEngineClient(
            "docstrings",
            config(cpu_threads=1),
            config(cpu_threads=1),
            ServerMetrics("docstrings", None),
        )
        await client.start()
        try:
            runs = []
            for i in range(3):
                client.send(Snapshot(next(client.keys), 0, 0), DECODE)
                time.sleep(0.3)  # its answer waits on the decode core's socket
                req = GenerateRequest(COMPLETIONS, PROMPTS[1], 3, {"ignore_eos": True})
                stream = client.add(f"r{i}", req, time.perf_counter(), "c", 0)
                time.sleep(1.0)  # Accepted, the transfer, the decode core's tokens
                events = [await stream.queue.get()]
                while not isinstance(events[-1], Tokens) or events[-1].finish_reason is None:
                    events.append(await asyncio.wait_for(stream.queue.get(), 60))
                await asyncio.sleep(0.1)  # nothing more may come
                assert stream.queue.empty() and not client.streams
                runs.append(events)
            return runs
        finally:
            await client.stop()

    for events in asyncio.run(run()):
        assert type(events[0]).__name__ == "Accepted", events
        assert sum(len(e.token_ids) for e in events[1:]) == 3
        assert [e.finish_reason for e in events[1:]][-1] == "length"


def test_a_second_pair_on_the_same_kv_port_fails_and_the_first_serves_on(reference):
    """Two pairs given one kv_port: the second fails at its start, naming kv_port, and leaves
    no process behind; the first pair's answers are all there and right (when the prefill core
    bound the link, the second pair's decode core joined the first pair's link and took every
    other KV message)."""
    from minilm.serve.kv_transfer import free_tcp_port
    from minilm.serve.openai_api import COMPLETIONS, GenerateRequest

    def pair(port: int) -> DisaggEngineClient:
        knobs = config(cpu_threads=1)
        return DisaggEngineClient(
            "docstrings", knobs, knobs, ServerMetrics("docstrings", None), kv_port=port
        )

    async def tokens(stream) -> list[int]:
        out: list[int] = []
        while True:
            e = await asyncio.wait_for(stream.queue.get(), 60)
            if isinstance(e, Tokens):
                out += e.token_ids
                if e.finish_reason is not None:
                    return out

    async def run() -> tuple[list[list[int]], str, list]:
        port = free_tcp_port("127.0.0.1")
        first, second = pair(port), pair(port)
        await first.start()
        try:
            with pytest.raises(RuntimeError) as failed:
                await second.start()
            streams = [
                first.add(
                    str(i),
                    GenerateRequest(COMPLETIONS, p, m, {"ignore_eos": True}),
                    time.perf_counter(),
                )
                for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS))
            ]
            outputs = await asyncio.gather(*(tokens(s) for s in streams))
            return outputs, str(failed.value), [p.process for p in second.procs]
        finally:
            await first.stop()

    outputs, error, processes = asyncio.run(run())
    assert "kv_port" in error and "cannot be bound" in error, error
    assert not any(p.is_alive() for p in processes)
    assert outputs == reference
