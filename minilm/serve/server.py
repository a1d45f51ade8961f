"""An OpenAI-compatible HTTP server in front of one engine (lesson 9).

    python -m minilm serve --model docstrings --policy continuous --port 8000

A thin layer: an HTTP request becomes `engine.add_request` (through the engine thread,
engine_thread.py), and the engine's tokens become Server-Sent Events. The engine runs
the same loop as offline; only its clock is the wall clock (core/clock.py: WallClock), so idle
time is real and a request arrives when its HTTP request does.

    POST /v1/completions        OpenAI completions, streaming (SSE) or not, `usage`
    POST /v1/chat/completions   the same behind a chat template (openai_api.chat_prompt)
    GET  /v1/models             the one model served
    GET  /health                200 while the engine runs, 503 when it stopped or is shutting down
    GET  /metrics               Prometheus text under vLLM's names (metrics.py)
    GET  /timeline?since=STEP&since_request=N   new timeline records as JSON (the live Gantt)
    GET  /                      a page with a prompt box that streams the answer

Errors are OpenAI's JSON: 400 for a bad request (openai_api.py names the bad value),
429 when `--max-waiting` requests already wait, 503 while shutting down. A client that
disconnects aborts its request: its KV blocks are freed before the next step and the
timeline records it as "aborted". Ctrl-C stops taking requests, lets those in flight
finish for `--drain-timeout` seconds, aborts the rest (their streams end with
finish_reason "abort"), and writes `--timeline`.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from ..config import EngineConfig
from ..core.clock import WallClock
from ..core.engine import Engine
from .detokenizer import IncrementalDetokenizer
from .engine_thread import Accepted, EngineThread, Rejected, RequestStream, Snapshot
from .metrics import ServerMetrics
from .openai_api import (CHAT, CHAT_TEMPLATE_DOC, COMPLETIONS, FINISH_REASONS, APIError, BadRequest, GenerateRequest,
                         chat_chunk, completion_chunk, full_response, now_s, parse_request, usage, usage_chunk)

PAGE = Path(__file__).with_name("page.html")


def sse(obj) -> str:
    """One Server-Sent Event: a `data:` line and a blank line."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.to_json(), status_code=e.status)


def unavailable(message: str) -> JSONResponse:
    return error_response(APIError(503, message, type="service_unavailable"))


class OpenAIServer:
    """The HTTP side of one engine: each route is a method. The engine itself is touched
    only by its thread (engine_thread.py); this side reads its fixed facts (tokenizer,
    max_model_len, meta) and its clock."""

    def __init__(self, engine: Engine, model_name: str, max_waiting: int | None = 1024,
                 timeline_path: str | None = None, stream_interval: int = 1):
        self.engine, self.model_name = engine, model_name
        self.max_waiting, self.timeline_path, self.stream_interval = max_waiting, timeline_path, stream_interval
        self.metrics = ServerMetrics(model_name)
        self.ids = itertools.count()
        self.thread: EngineThread | None = None  # made when the app starts (it needs the running event loop)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        """The engine thread starts and stops with the app."""
        self.thread = EngineThread(self.engine, asyncio.get_running_loop(), self.max_waiting, self.metrics,
                                   self.stream_interval)
        app.state.engine_thread = self.thread
        self.metrics.update_gauges(self.engine)
        self.thread.start()
        yield
        self.thread.stop()
        if self.timeline_path:
            tl = self.engine.timeline
            tl.to_json(self.timeline_path)
            print(f"minilm serve: wrote {self.timeline_path} ({len(tl.requests)} requests, {len(tl.steps)} steps)",
                  file=sys.stderr)

    # ---- POST /v1/completions and /v1/chat/completions ---------------------------------
    async def completions(self, http: Request) -> Response:
        return await self.generate(http, COMPLETIONS)

    async def chat_completions(self, http: Request) -> Response:
        return await self.generate(http, CHAT)

    async def generate(self, http: Request, kind: str) -> Response:
        arrival = self.engine.clock.now  # the request arrived now: its TTFT counts from here
        try:
            try:
                body = await http.json()
            except ValueError as e:
                raise BadRequest(f"the request body is not valid JSON: {e}")
            req = parse_request(body, kind, model_name=self.model_name, tokenizer=self.engine.tokenizer,
                                max_model_len=self.engine.config.max_model_len)
        except APIError as e:
            return error_response(e)
        if not self.thread.thread.is_alive():
            return unavailable(f"the engine is not running ({self.thread.error!r})")
        stream = self.thread.add(self.request_id(http, req), req, arrival)
        try:
            first = await stream.queue.get()
        except asyncio.CancelledError:  # the server is going down before the engine took it
            self.thread.abort(stream)
            raise
        if isinstance(first, Rejected):
            return error_response(first.error)
        assert isinstance(first, Accepted)
        if req.stream:
            return StreamingResponse(self.stream_events(stream, req, first.prompt_len), media_type="text/event-stream")
        return await self.full_completion(http, stream, req, first.prompt_len)

    def request_id(self, http: Request, req: GenerateRequest) -> str:
        """The engine's id: the client's X-Request-Id (as vLLM), else the user's name (the Gantt's
        row label) or "req", and a number."""
        given = http.headers.get("x-request-id")
        if given:
            return given
        name = re.sub(r"[^A-Za-z0-9_.-]", "", req.user or "")[:24] or "req"
        return f"{name}-{next(self.ids)}"

    async def stream_events(self, stream: RequestStream, req: GenerateRequest, prompt_len: int):
        """The SSE body: one chunk per token (its text may be '' while a character is incomplete);
        the last token's chunk carries the finish_reason. Tokens that queued up while the
        client was slow go out in one write."""
        rid, created = stream.request_id, now_s()
        response_id = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{rid}"
        detok = IncrementalDetokenizer(self.engine.tokenizer)
        num_tokens, finish_reason = 0, None
        try:
            while finish_reason is None:
                events = [await stream.queue.get()]
                while not stream.queue.empty():
                    events.append(stream.queue.get_nowait())
                out = []
                for event in events:
                    if isinstance(event, Rejected):  # the engine thread died: say so, end the stream
                        yield sse(event.error.to_json()) + "data: [DONE]\n\n"
                        return
                    finish_reason = FINISH_REASONS.get(event.finish_reason)
                    if not event.token_ids:  # aborted between steps: an empty last chunk
                        out.append(self.chunk(req.kind, response_id, created, "", finish_reason, num_tokens == 0))
                    for k, token in enumerate(event.token_ids):
                        last = k == len(event.token_ids) - 1 and finish_reason is not None
                        text = detok.add([token], final=last)
                        out.append(self.chunk(req.kind, response_id, created, text, finish_reason if last else None,
                                              num_tokens == 0))
                        num_tokens += 1
                if finish_reason is not None:
                    if req.include_usage:
                        out.append(sse(usage_chunk(response_id, self.model_name, created, req.kind,
                                                   usage(prompt_len, num_tokens))))
                    out.append("data: [DONE]\n\n")
                yield "".join(out)
        finally:
            if finish_reason is None:  # the client went away (or the server stops): free its KV now
                self.thread.abort(stream)

    def chunk(self, kind: str, response_id: str, created: int, text: str, finish_reason: str | None,
              first: bool) -> str:
        if kind == CHAT:
            return sse(chat_chunk(response_id, self.model_name, created, text, finish_reason, first))
        return sse(completion_chunk(response_id, self.model_name, created, text, finish_reason))

    async def full_completion(self, http: Request, stream: RequestStream, req: GenerateRequest,
                              prompt_len: int) -> Response:
        """Non-streaming: wait for the last token, unless the client disconnects first."""
        result, gone = asyncio.ensure_future(collect(stream)), asyncio.ensure_future(disconnected(http))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not result.done():
                result.cancel()
                self.thread.abort(stream)
        if not result.done() or result.cancelled():
            return Response(status_code=499)  # nginx's "client closed request": nobody reads it
        if isinstance(result.result(), APIError):
            return error_response(result.result())
        token_ids, reason = result.result()
        rid = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{stream.request_id}"
        return JSONResponse(full_response(rid, self.model_name, now_s(), req.kind,
                                          self.engine.tokenizer.decode(token_ids), FINISH_REASONS[reason],
                                          usage(prompt_len, len(token_ids))))

    # ---- GET routes ----------------------------------------------------------------------
    async def models(self):
        meta = self.engine.timeline.meta
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": now_s(),
                                            "owned_by": "minilm", "root": str(meta.get("model", self.model_name)),
                                            "max_model_len": self.engine.config.max_model_len,
                                            "policy": meta.get("policy")}]}

    async def health(self):
        if not self.thread.alive:
            return unavailable("the engine is not running" if self.thread.draining_until is None
                               else "the server is shutting down")
        return {"status": "ok"}

    async def prometheus_metrics(self):
        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def timeline(self, since: int = 0, since_request: int = 0):
        """Timeline records from step `since` and finished request `since_request` on, plus the
        unfinished requests as they are now; taken by the engine thread between two steps."""
        if since < 0 or since_request < 0:
            return error_response(BadRequest(f"since={since}, since_request={since_request}: must be >= 0"))
        if not self.thread.thread.is_alive():
            return unavailable("the engine is not running")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.thread.send(Snapshot(since, since_request, lambda d: loop.call_soon_threadsafe(future.set_result, d)))
        return await future

    async def page(self):
        return PAGE.read_text()


async def collect(stream: RequestStream) -> tuple[list[int], str] | APIError:
    """A request's whole output: its tokens and the engine's finish reason (or the error that ended it)."""
    token_ids = []
    while True:
        event = await stream.queue.get()
        if isinstance(event, Rejected):  # the engine thread died
            return event.error
        token_ids += event.token_ids
        if event.finish_reason is not None:
            return token_ids, event.finish_reason


async def disconnected(http: Request) -> None:
    """Returns when the client has gone away."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: Engine, model_name: str, *, max_waiting: int | None = 1024,
               timeline_path: str | None = None, stream_interval: int = 1) -> FastAPI:
    """The FastAPI app over one engine; the engine thread starts and stops with it."""
    server = OpenAIServer(engine, model_name, max_waiting, timeline_path, stream_interval)
    app = FastAPI(title="minilm", lifespan=server.lifespan)
    app.state.engine, app.state.metrics = engine, server.metrics
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
    thread and writes the timeline. A second Ctrl-C quits at once."""

    def __init__(self, app: FastAPI, host: str, port: int, drain_timeout: float = 5.0, log_level: str = "info",
                 access_log: bool = False):
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                if not self.should_exit and hasattr(app.state, "engine_thread"):
                    app.state.engine_thread.drain(drain_timeout)
                super().handle_exit(sig, frame)

        self.server = Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log))

    def run(self) -> None:
        self.server.run()


def serve(model: str, config: EngineConfig, *, name: str | None = None, host: str = "127.0.0.1",
          port: int = 8000, max_waiting: int = 1024, drain_timeout: float = 5.0, stream_interval: int = 1,
          timeline_path: str | None = None, log_level: str = "warning", access_log: bool = False) -> None:
    """`python -m minilm serve ...` (its arguments: cli.py): one engine on the wall clock, until Ctrl-C."""
    engine = Engine(model, config, clock=WallClock(config.device))
    name = name or Path(str(model)).name
    app = create_app(engine, name, max_waiting=max_waiting, timeline_path=timeline_path,
                     stream_interval=stream_interval)
    c = engine.config
    print(f"minilm serve: {name}, policy {engine.policy.name}, "
          f"max_num_seqs {c.max_num_seqs}, max_model_len {c.max_model_len}, {c.num_blocks} KV blocks of "
          f"{c.block_size}; chat template: {CHAT_TEMPLATE_DOC}", file=sys.stderr)
    print(f"minilm serve: page at http://{host}:{port}/ , OpenAI API at http://{host}:{port}/v1", file=sys.stderr)
    try:
        DrainingServer(app, host, port, drain_timeout, log_level, access_log).run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
