"""What passes between the HTTP side and the engine's side of the server (lesson 9).

Commands go to the engine, events come back. Both are msgspec structs: the in-process
design hands them over as they are (engine_thread.py); the process design sends them
as msgpack over ZeroMQ (engine_core.py), as vLLM V1's API server and engine core do.

Every request's messages carry its `key`, a number the HTTP side gives each request it
sends: two HTTP requests that ask for the same request id stay two streams, so a refused
duplicate can never abort (or receive the tokens of) the request it collided with.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Message(msgspec.Struct, tag=True, tag_field="kind"):
    """A command or an event: msgpack carries its class's name, so a list of mixed ones decodes."""


# ---- commands: HTTP side -> engine ------------------------------------------------------
class Add(Message):
    key: int
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any]  # SamplingParams fields
    arrival: float  # time.perf_counter() when the HTTP request came (shared by processes)


class Abort(Message):
    key: int
    reason: str = "aborted"  # "stop" when the HTTP side found a stop string


class Snapshot(Message):
    key: int
    since_step: int
    since_request: int


class Drain(Message):
    timeout: float  # seconds in-flight requests may still run; then they are aborted


class Stop(Message):
    pass


# ---- the KV link: prefill engine core -> decode engine core (kv_transfer.py) ---------------
class KVBlocks(Message):
    """A prompt's KV, sent by the prefill engine core once it has sampled the first token: the
    request itself (the decode side runs it from there), the K/V of its prompt's blocks, and the
    prefix-cache keys of its full blocks. `kv` is the raw bytes of a tensor of `shape`
    [layers, 2 (K, V), blocks, block_size, kv heads, head dim] and `dtype`, block i of the
    prompt at [:, :, i] (the engine's cache layout, model/runner.py): what a network link would
    carry as it is."""

    key: int
    request_id: str
    prompt_ids: list[int]
    first_token: int
    first_logprobs: list | None  # [logprob, [[top id, logprob], ...]] where asked
    max_tokens: int
    sampling: dict[str, Any]  # SamplingParams fields but max_tokens
    arrival: float  # time.perf_counter() when the HTTP request came
    block_hashes: list[int]  # hash() of each full block's prefix-cache key (core/prefix_cache.py)
    dtype: str  # torch's name: float32, bfloat16, ...
    shape: list[int]
    kv: bytes
    sent_at: float  # time.perf_counter() when the prefill side began to send


class KVCancel(Message):
    """The request was aborted on the prefill side: if its KVBlocks came before, the decode side
    aborts it too (the link keeps order: this never overtakes its KVBlocks)."""

    key: int
    reason: str = "aborted"


Command = Add | Abort | Snapshot | Drain | Stop | KVBlocks | KVCancel


# ---- events: engine -> HTTP side -----------------------------------------------------------
class Accepted(Message):
    key: int
    prompt_len: int


class Rejected(Message):
    key: int
    status: int  # 400, 429, 503, 500
    message: str
    param: str | None = None  # the engine's name for the bad value (openai_api maps it)
    code: str | None = None
    type: str = "invalid_request_error"


class Tokens(Message):
    key: int
    token_ids: list[int]
    logprobs: list | None = None  # per token: [logprob, [[top id, logprob], ...]]
    finish_reason: str | None = None  # the engine's: stop | length | aborted


class StepStats(Message):
    """One step's numbers for the Prometheus metrics (metrics.py), measured where the engine runs."""

    generation_tokens: int
    prompt_tokens: int
    ttfts: list[float]
    queue_times: list[float]
    itls: list[float]
    finished: list[tuple[str, float]]  # (finish reason, end-to-end latency)
    preemptions: int
    running: int
    waiting: int
    kv_usage: float
    kv_blocks_used: int  # the router's load (engine_client.py `place`)
    kv_blocks_total: int
    drafts: list[
        tuple[int, int]
    ] = []  # speculative decoding: (drafts, accepted) of each request that verified some


class SnapshotData(Message):
    key: int
    data: dict[str, Any]


class Ready(Message):
    """The engine-core process has built its engine and takes commands."""

    meta: dict[str, Any]
    max_model_len: int


class EngineError(Message):
    """The engine-core process failed and is exiting."""

    message: str


Event = Accepted | Rejected | Tokens | StepStats | SnapshotData | Ready | EngineError

encode = msgspec.msgpack.Encoder().encode
decode_commands = msgspec.msgpack.Decoder(list[Command]).decode
decode_events = msgspec.msgpack.Decoder(list[Event]).decode
