"""An OpenAI-compatible HTTP server in front of one engine, or of several (lesson 9).

    python -m minilm serve --model docstrings --policy continuous --port 8000
    python -m minilm serve --data-parallel-size 2 --router least_outstanding   # two engine cores

A thin layer: an HTTP request becomes an `Add` command for the engine, and the engine's
tokens become Server-Sent Events. The engine runs the same loop as offline, on the wall
clock, in a process of its own (engine_core.py, vLLM V1's split; `--engine-core thread`
keeps it in a thread of this process: engine_thread.py). This side parses and tokenizes,
detokenizes, cuts stop strings and formats; it never touches the engine itself. With
`--data-parallel-size N`, N engine-core processes (each its own model, scheduler and KV
cache) serve behind this one process, and `--router` picks the core for each request
(engine_client.py `place`, minilm/router.py), as vLLM's data parallelism.

    POST /v1/completions        OpenAI completions, streaming (SSE) or not, `usage`, n choices
    POST /v1/chat/completions   the same behind a chat template (openai_api.chat_prompt)
    GET  /v1/models             the one model served
    GET  /health                200 while the engine runs, 503 when it stopped or is shutting down
    GET  /metrics               Prometheus text under vLLM's names (metrics.py)
    GET  /timeline?since=STEP&since_request=N   new timeline records as JSON (the live Gantt), of the
                                last `--timeline-window` steps and requests (history.py): their public
                                view only, lengths and times, no token ids (public.py `public_view`);
                                `&engine=I` for engine core I's (each core has its own cursors)
    GET  /                      a page with a prompt box that streams the answer

A room shares one server, and nobody reads another's text: /timeline shows each request
under its id, which is the client's X-Request-Id (a name it chose to show: the page's name
box, bench-serve's ids) or an anonymous `req-N`, never the body's `user`. `--api-key`
guards every route but /, /health, /metrics and /timeline (auth.py); `--max-inflight-per-
client N` keeps one address from taking the whole batch.

Errors are OpenAI's JSON: 400 for a bad request (openai_api.py names the bad value), 401
without the key, 413 for a body larger than any prompt the model could take (refused
before it is read, so no request can make the others wait), 429 when `--max-waiting`
requests already wait or a client has `--max-inflight-per-client` in flight, 503 while
shutting down or once the engine has stopped. A client that disconnects aborts
its request: its KV blocks are freed before the next step and the timeline records it as
"aborted". Ctrl-C stops taking requests, lets those in flight finish for
`--drain-timeout` seconds, aborts the rest (their streams end with finish_reason
"abort"), and closes `--timeline` (written as the run goes: serve/history.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from ..config import EngineConfig
from .auth import APIKeyMiddleware
from .engine_client import EngineClient, RequestStream
from .history import DEFAULT_WINDOW
from .messages import Rejected, Tokens
from .openai_api import (
    CHAT,
    CHAT_TEMPLATE_DOC,
    COMPLETIONS,
    APIError,
    BadRequest,
    GenerateRequest,
    chunk,
    full_response,
    now_s,
    parse_request,
    usage,
    usage_chunk,
)
from .output import Choice, merge_logprobs

PAGE = Path(__file__).with_name("page.html")


def sse(obj) -> str:
    """One Server-Sent Event: a `data:` line and a blank line."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def error_response(e: APIError) -> JSONResponse:
    # a refused oversized body: close the connection rather than read the rest of it
    return JSONResponse(
        e.to_json(),
        status_code=e.status,
        headers={"Connection": "close"} if e.status == 413 else None,
    )


def unavailable(message: str) -> JSONResponse:
    return error_response(APIError(503, message, type="service_unavailable"))


def rejected(event: Rejected, req: GenerateRequest) -> APIError:
    """The engine's refusal as OpenAI's error (its names mapped to the body's fields)."""
    return APIError(
        event.status,
        event.message,
        req.param(event.param) if event.param else None,
        event.code,
        event.type,
    )


def max_token_bytes(tokenizer) -> int:
    """The most bytes one token of this vocabulary stands for (a byte tokenizer's: 1)."""
    return max(len(tokenizer.decode([i]).encode()) for i in range(tokenizer.vocab_size))


class OpenAIServer:
    """The HTTP side of one engine: each route is a method; the engine is reached only
    through `client` (engine_client.py)."""

    def __init__(
        self,
        client: EngineClient,
        model_name: str,
        tokenizer,
        max_inflight_per_client: int | None = None,
    ):
        """`max_inflight_per_client`: requests (n choices count as n) one client address may have
        in the engine at once; past it, 429 (None: no limit)."""
        self.client, self.model_name, self.tokenizer = client, model_name, tokenizer
        self.max_inflight_per_client = max_inflight_per_client
        self.ids = itertools.count()
        self.max_prompt_bytes = self.max_body_bytes = (
            None  # from the model's context, once the engine is ready
        )

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        """The engine starts and stops with the app."""
        await self.client.start()
        # A prompt's tokens each stand for at least one byte, so a prompt of more bytes than
        # max_model_len tokens of the longest kind could never fit; JSON escapes a byte in at
        # most 6 characters. Bodies past that are refused unread (413).
        self.max_prompt_bytes = self.client.info.max_model_len * max_token_bytes(self.tokenizer)
        self.max_body_bytes = 6 * self.max_prompt_bytes + (1 << 20)
        yield
        await self.client.stop()

    # ---- POST /v1/completions and /v1/chat/completions ---------------------------------
    async def completions(self, http: Request) -> Response:
        return await self.generate(http, COMPLETIONS)

    async def chat_completions(self, http: Request) -> Response:
        return await self.generate(http, CHAT)

    async def generate(self, http: Request, kind: str) -> Response:
        arrival = time.perf_counter()  # the request arrived now: its TTFT counts from here
        try:
            req = parse_request(
                await self.read_json(http),
                kind,
                model_name=self.model_name,
                tokenizer=self.tokenizer,
                max_model_len=self.client.info.max_model_len,
                max_prompt_bytes=self.max_prompt_bytes,
            )
        except APIError as e:
            return error_response(e)
        if not self.client.alive:
            return unavailable(
                "the server is shutting down"
                if self.client.error is None
                else f"the engine is not running ({self.client.error})"
            )
        address = http.client.host if http.client else "unknown"
        try:
            self.check_client_limit(address, req.n)
        except APIError as e:
            return error_response(e)
        rid = self.request_id(http)
        ids = [rid] if req.n == 1 else [f"{rid}.{i}" for i in range(req.n)]
        core = self.client.place(ids, req.prompt_ids)  # one core for all n: they share the prompt
        streams = [
            self.client.add(ids[i], req.child(i), arrival, address, core) for i in range(req.n)
        ]
        try:
            firsts = [await s.queue.get() for s in streams]
        except asyncio.CancelledError:  # the server is going down before the engine answered
            for s in streams:
                self.client.abort(s)
            raise
        refused = next((e for e in firsts if isinstance(e, Rejected)), None)
        if refused is not None:
            for s, first in zip(streams, firsts):
                if not isinstance(first, Rejected):
                    self.client.abort(s)
            return error_response(rejected(refused, req))
        prompt_len = firsts[0].prompt_len
        if req.stream:
            return StreamingResponse(
                self.stream_events(streams, req, prompt_len), media_type="text/event-stream"
            )
        return await self.full_completion(http, streams, req, prompt_len)

    async def read_json(self, http: Request):
        """The body, read only up to what a request may hold (413 past it), then parsed."""
        declared = http.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large(int(declared), self.max_body_bytes)
        body = bytearray()
        async for part in http.stream():
            body += part
            if len(body) > self.max_body_bytes:
                raise too_large(len(body), self.max_body_bytes)
        try:
            return json.loads(body)
        except ValueError as e:
            raise BadRequest(f"the request body is not valid JSON: {e}") from None

    def check_client_limit(self, address: str, n: int) -> None:
        """429 when this address would have more than `max_inflight_per_client` requests in the
        engine (counted by engine_client.py until each one's last event: a stream that ends or whose
        client leaves gives its place back)."""
        limit, have = self.max_inflight_per_client, self.client.in_flight[address]
        if limit is not None and have + n > limit:
            raise APIError(
                429,
                f"client {address} has {have} request(s) in flight and asks for {n} more; this "
                f"server takes at most {limit} per client at once (--max-inflight-per-client "
                f"{limit}; n choices count as n): retry when one has finished",
                code="client_limit",
                type="rate_limit_exceeded",
            )

    def request_id(self, http: Request) -> str:
        """The engine's id, which the room sees as the request's row label (GET /timeline): the
        client's X-Request-Id (as vLLM; a name the client chose to show, like the page's name
        box), else an anonymous `req-N`. Never the body's `user`: OpenAI's end-user id (an
        account, an email) is not a name its owner chose to show a room."""
        return http.headers.get("x-request-id") or f"req-{next(self.ids)}"

    async def stream_events(
        self, streams: list[RequestStream], req: GenerateRequest, prompt_len: int
    ):
        """The SSE body: one chunk per token and choice (its text may be '' while a character is
        incomplete); a choice's last chunk carries its finish_reason. Tokens that queued up while
        the client was slow go out in one write."""
        created = now_s()
        response_id = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{streams[0].request_id}"
        choices = [Choice(i, req, self.tokenizer) for i in range(req.n)]
        merged: asyncio.Queue = asyncio.Queue()
        forwards = [asyncio.create_task(forward(s, i, merged)) for i, s in enumerate(streams)]
        open_choices = set(range(req.n))
        try:
            while open_choices:
                events = [await merged.get()]
                while not merged.empty():
                    events.append(merged.get_nowait())
                out = []
                for i, event in events:
                    if isinstance(event, Rejected):  # the engine stopped: say so, end the stream
                        yield (
                            sse(APIError(event.status, event.message, type=event.type).to_json())
                            + "data: [DONE]\n\n"
                        )
                        return
                    out += self.choice_chunks(choices[i], event, response_id, created)
                    if choices[i].finish_reason is not None and i in open_choices:
                        open_choices.discard(i)
                        if choices[i].stopped:
                            self.client.abort(streams[i], reason="stop")
                if not open_choices:
                    if req.include_usage:
                        out.append(
                            sse(
                                usage_chunk(
                                    response_id,
                                    self.model_name,
                                    created,
                                    req.kind,
                                    usage(prompt_len, sum(c.num_tokens for c in choices)),
                                )
                            )
                        )
                    out.append("data: [DONE]\n\n")
                yield "".join(out)
        finally:
            for task in forwards:
                task.cancel()
            for i in open_choices:  # the client went away (or the server stops): free their KV now
                self.client.abort(streams[i])

    def choice_chunks(
        self, choice: Choice, event: Tokens, response_id: str, created: int
    ) -> list[str]:
        """The SSE events of one Tokens event for one choice: a chunk per token (the last one
        carrying the finish), or one empty chunk when it finishes with no token."""
        out, first = [], choice.num_tokens == 0
        tokens = event.token_ids or [None]
        for k, token in enumerate(tokens):
            last = k == len(tokens) - 1
            one = Tokens(
                event.key,
                [token] if token is not None else [],
                None if event.logprobs is None else event.logprobs[k : k + 1],
                event.finish_reason if last else None,
            )
            if choice.finish_reason is not None:
                break
            text, logprobs = choice.feed(one)
            out.append(
                sse(
                    chunk(
                        response_id,
                        self.model_name,
                        created,
                        choice.req.kind,
                        choice.index,
                        text,
                        choice.finish_reason,
                        logprobs,
                        first,
                    )
                )
            )
            first = False
        return out

    async def full_completion(
        self, http: Request, streams: list[RequestStream], req: GenerateRequest, prompt_len: int
    ) -> Response:
        """Non-streaming: wait for every choice's end, unless the client disconnects first."""
        choices = [Choice(i, req, self.tokenizer) for i in range(req.n)]
        result = asyncio.ensure_future(
            asyncio.gather(*(self.collect(s, c) for s, c in zip(streams, choices)))
        )
        gone = asyncio.ensure_future(disconnected(http))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not result.done():
                result.cancel()  # its choices end cancelled: the gather's outcome is taken
                result.add_done_callback(lambda f: f.cancelled() or f.exception())  # (not logged)
                for s in streams:
                    self.client.abort(s)
        if not result.done() or result.cancelled():
            return Response(status_code=499)  # nginx's "client closed request": nobody reads it
        error = next((r for r in result.result() if isinstance(r, APIError)), None)
        if error is not None:
            return error_response(error)
        rid = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{streams[0].request_id}"
        return JSONResponse(
            full_response(
                rid,
                self.model_name,
                now_s(),
                req.kind,
                result.result(),
                usage(prompt_len, sum(c.num_tokens for c in choices)),
            )
        )

    async def collect(
        self, stream: RequestStream, choice: Choice
    ) -> tuple[str, str, dict | None] | APIError:
        """One choice's whole text, finish reason and logprobs (or the error that ended it)."""
        texts, logprobs = [], []
        while choice.finish_reason is None:
            event = await stream.queue.get()
            if isinstance(event, Rejected):  # the engine stopped
                return APIError(event.status, event.message, type=event.type)
            text, lp = choice.feed(event)
            texts.append(text)
            logprobs.append(lp)
        if choice.stopped:
            self.client.abort(stream, reason="stop")
        return "".join(texts), choice.finish_reason, merge_logprobs(logprobs)

    # ---- GET routes ----------------------------------------------------------------------
    async def models(self):
        meta = self.client.info.meta
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": now_s(),
                    "owned_by": "minilm",
                    "root": str(meta.get("model", self.model_name)),
                    "max_model_len": self.client.info.max_model_len,
                    "policy": meta.get("policy"),
                }
            ],
        }

    async def health(self):
        if not self.client.alive:
            return unavailable(
                "the engine is not running"
                if self.client.error is not None
                else "the server is shutting down"
            )
        return {"status": "ok"}

    async def prometheus_metrics(self):
        return Response(
            self.client.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def timeline(self, since: int = 0, since_request: int = 0, engine: int = 0):
        """Engine core `engine`'s timeline records from step `since` and finished request
        `since_request` on, plus its unfinished requests as they are now; taken by that core
        between two steps. `engine` and `data_parallel_size` say whose and of how many; the
        meta's `replica` names the core, as the simulated fleet's timelines do (sim/cluster.py)."""
        if since < 0 or since_request < 0:
            return error_response(
                BadRequest(f"since={since}, since_request={since_request}: must be >= 0")
            )
        n = self.client.data_parallel_size
        if not 0 <= engine < n:
            return error_response(
                BadRequest(f"engine={engine}: this server has engine cores 0..{n - 1}", "engine")
            )
        if self.client.cores[engine].error is not None:
            return unavailable(
                "the engine is not running" if n == 1 else f"engine core {engine} is not running"
            )
        data = await self.client.snapshot(since, since_request, engine)
        if not data:  # it stopped while answering
            return unavailable(f"engine core {engine} is not running")
        meta = data["meta"] | ({"replica": f"engine {engine}"} if n > 1 else {})
        return {**data, "meta": meta, "engine": engine, "data_parallel_size": n}

    async def page(self):
        return PAGE.read_text()


def too_large(size: int, limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is {size:,} bytes; this server takes at most {limit:,} (a prompt "
        f"longer than that could not fit the model's context)",
        code="request_too_large",
    )


async def forward(stream: RequestStream, index: int, merged: asyncio.Queue) -> None:
    """A choice's events onto the response's one queue, until its last."""
    while True:
        event = await stream.queue.get()
        merged.put_nowait((index, event))
        if isinstance(event, Rejected) or event.finish_reason is not None:
            return


async def disconnected(http: Request) -> None:
    """Returns when the client has gone away."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def create_app(
    client: EngineClient,
    model_name: str,
    tokenizer,
    api_key: str | None = None,
    max_inflight_per_client: int | None = None,
) -> FastAPI:
    """The FastAPI app over one engine client; the engine starts and stops with the app.
    `api_key`: every route but the public ones asks for it (auth.py)."""
    server = OpenAIServer(client, model_name, tokenizer, max_inflight_per_client)
    app = FastAPI(title="minilm", lifespan=server.lifespan)
    if api_key is not None:
        app.add_middleware(APIKeyMiddleware, key=api_key)
    app.state.client = client
    app.post("/v1/completions")(server.completions)
    app.post("/v1/chat/completions")(server.chat_completions)
    app.get("/v1/models")(server.models)
    app.get("/health")(server.health)
    app.get("/metrics")(server.prometheus_metrics)
    app.get("/timeline")(server.timeline)
    app.get("/", response_class=HTMLResponse)(server.page)
    return app


# ---- python -m minilm serve ------------------------------------------------------------
class DrainingServer:
    """uvicorn's server, with Ctrl-C (or SIGTERM) first draining the engine: no new requests,
    those in flight get `drain_timeout` seconds to finish, then the rest are aborted. uvicorn
    waits for every open response to end before it stops the app, which stops the engine
    and writes the timeline. A second Ctrl-C quits at once."""

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        drain_timeout: float = 5.0,
        log_level: str = "info",
        access_log: bool = False,
    ):
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                if not self.should_exit:
                    app.state.client.drain(drain_timeout)
                super().handle_exit(sig, frame)

        # asyncio and h11 by name: uvicorn's "auto" would take uvloop and httptools wherever
        # another package (guidellm, a test requirement) installed them, so the same server
        # would run on different event loops on different machines
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=access_log,
            loop="asyncio",
            http="h11",
        )
        self.server = Server(config)

    def run(self) -> None:
        self.server.run()


def serve(
    model: str,
    config: EngineConfig,
    *,
    name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_waiting: int = 1024,
    drain_timeout: float = 5.0,
    stream_interval: int = 1,
    timeline_path: str | None = None,
    timeline_window: int = DEFAULT_WINDOW,
    engine_core: str = "process",
    data_parallel_size: int = 1,
    router: str = "least_outstanding",
    log_level: str = "warning",
    access_log: bool = False,
    api_key: str | None = None,
    max_inflight_per_client: int | None = None,
    kv_transfer: dict | None = None,
) -> None:
    """`python -m minilm serve ...` (its arguments: cli.py): `data_parallel_size` engine cores on the
    wall clock, until Ctrl-C. `kv_transfer` (link_options in kv_transfer.py): a prefill and a
    decode engine core instead."""
    from ..model.loader import resolve_model_path
    from ..model.tokenizer import load_tokenizer
    from .metrics import ServerMetrics

    name = name or Path(str(model)).name
    metrics = ServerMetrics(name, config.speculative_config, data_parallel_size)
    options = dict(
        max_waiting=max_waiting,
        stream_interval=stream_interval,
        timeline_path=timeline_path,
        window=timeline_window,
    )
    if (
        timeline_path is None
    ):  # block tables are private (public.py): only the file shows them (the KV map)
        config = replace(config, record_kv_blocks=False)
    if kv_transfer is not None:
        from .kv_transfer import DisaggEngineClient

        client, tokenizer = (
            DisaggEngineClient(model, config, config, metrics, **kv_transfer, **options),
            load_tokenizer(resolve_model_path(model)),
        )
        engine_core = "prefill and a decode process"
    elif engine_core == "process":
        from .engine_core import ProcessEngineClient

        client, tokenizer = (
            ProcessEngineClient(
                model,
                config,
                metrics,
                **options,
                data_parallel_size=data_parallel_size,
                router=router,
            ),
            load_tokenizer(resolve_model_path(model)),
        )
    else:
        from ..core.clock import WallClock
        from ..core.engine import Engine
        from .engine_thread import ThreadEngineClient

        engine = Engine(model, config, clock=WallClock(config.device))
        client, tokenizer = ThreadEngineClient(engine, metrics, **options), engine.tokenizer
    app = create_app(client, name, tokenizer, api_key, max_inflight_per_client)
    print(
        f"minilm serve: {name}, policy {config.policy}, "
        + (
            f"{data_parallel_size} engine cores in processes behind router {router}, "
            if data_parallel_size > 1
            else f"engine core in a {engine_core}, "
        )
        + f"max_num_seqs "
        f"{config.max_num_seqs}, prefix caching {'on' if config.enable_prefix_caching else 'off'}; chat template: "
        f"{CHAT_TEMPLATE_DOC}",
        file=sys.stderr,
    )
    room = [
        f"API key {'required (--api-key)' if api_key else 'not required'}",
        f"at most {max_inflight_per_client} requests in flight per client"
        if max_inflight_per_client
        else "no per-client limit",
    ]
    print(
        f"minilm serve: page at http://{host}:{port}/ , OpenAI API at http://{host}:{port}/v1 ({', '.join(room)})",
        file=sys.stderr,
    )
    try:
        DrainingServer(app, host, port, drain_timeout, log_level, access_log).run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
