"""An OpenAI-compatible HTTP server in front of one engine (lesson 9).

    python -m minilm serve --model docstrings --policy continuous --port 8000

A thin layer: an HTTP request becomes `engine.add_request` (through the engine thread,
engine_thread.py), and the engine's tokens become Server-Sent Events. The engine runs
the same loop as offline; only its clock is the wall clock (clock.WallClock), so idle
time is real and a request arrives when its HTTP request does.

    POST /v1/completions        OpenAI completions, streaming (SSE) or not, `usage`
    POST /v1/chat/completions   the same behind a chat template (openai_api.chat_prompt)
    GET  /v1/models             the one model served
    GET  /health                200 while the engine runs, 503 when it stopped or is shutting down
    GET  /metrics               Prometheus text under vLLM's names (server_metrics.py)
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

from .detokenizer import IncrementalDetokenizer
from .engine import Engine
from .engine_thread import Accepted, EngineThread, Rejected, RequestStream, Snapshot
from .openai_api import (CHAT, CHAT_TEMPLATE_DOC, COMPLETIONS, FINISH_REASONS, APIError, BadRequest, GenerateRequest, chat_chunk,
                         completion_chunk, full_response, now_s, parse_request, usage, usage_chunk)
from .server_metrics import ServerMetrics

PAGE = Path(__file__).with_name("serve_page.html")


def sse(obj) -> str:
    """One Server-Sent Event: a `data:` line and a blank line."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.to_json(), status_code=e.status)


def create_app(engine: Engine, model_name: str, *, max_waiting: int | None = 1024,
               timeline_path: str | None = None, stream_interval: int = 1) -> FastAPI:
    """The FastAPI app. The engine thread starts and stops with the app (its lifespan)."""
    metrics = ServerMetrics(model_name)
    ids = itertools.count()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.engine_thread = EngineThread(engine, asyncio.get_running_loop(), max_waiting, metrics,
                                               stream_interval)
        metrics.update_gauges(engine)
        app.state.engine_thread.start()
        yield
        app.state.engine_thread.stop()
        if timeline_path:
            engine.timeline.to_json(timeline_path)
            print(f"minilm serve: wrote {timeline_path} ({len(engine.timeline.requests)} requests, "
                  f"{len(engine.timeline.steps)} steps)", file=sys.stderr)

    app = FastAPI(title="minilm", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics

    def request_id(http: Request, req: GenerateRequest) -> str:
        """The engine's id: the client's X-Request-Id (as vLLM), else the user's name (the Gantt's
        row label) or the endpoint, and a number."""
        given = http.headers.get("x-request-id")
        if given:
            return given
        name = re.sub(r"[^A-Za-z0-9_.-]", "", req.user or "")[:24] or "req"
        return f"{name}-{next(ids)}"

    async def generate(http: Request, kind: str) -> Response:
        arrival = engine.clock.now  # the request arrived now: its TTFT counts from here
        thread: EngineThread = app.state.engine_thread
        try:
            try:
                body = await http.json()
            except ValueError as e:
                raise BadRequest(f"the request body is not valid JSON: {e}")
            req = parse_request(body, kind, model_name=model_name, tokenizer=engine.tokenizer,
                                max_model_len=engine.config.max_model_len)
        except APIError as e:
            return error_response(e)
        if not thread.thread.is_alive():
            return error_response(APIError(503, f"the engine is not running ({thread.error!r})",
                                           type="service_unavailable"))
        rid = request_id(http, req)
        stream = thread.add(rid, req, arrival)
        try:
            first = await stream.queue.get()
        except asyncio.CancelledError:  # the server is going down before the engine took it
            thread.abort(stream)
            raise
        if isinstance(first, Rejected):
            return error_response(first.error)
        assert isinstance(first, Accepted)
        if req.stream:
            return StreamingResponse(stream_events(thread, stream, req, first.prompt_len),
                                     media_type="text/event-stream")
        return await full_completion(http, thread, stream, req, first.prompt_len)

    async def stream_events(thread: EngineThread, stream: RequestStream, req: GenerateRequest, prompt_len: int):
        """The SSE body: one chunk per token (its text may be '' while a character is incomplete);
        the last token's chunk carries the finish_reason. Tokens that queued up while the
        client was slow go out in one write."""
        rid, created = stream.request_id, now_s()
        response_id = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{rid}"
        detok = IncrementalDetokenizer(engine.tokenizer)
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
                        out.append(chunk(req.kind, response_id, created, "", finish_reason, num_tokens == 0))
                    for k, token in enumerate(event.token_ids):
                        last = k == len(event.token_ids) - 1 and finish_reason is not None
                        text = detok.add([token], final=last)
                        out.append(chunk(req.kind, response_id, created, text, finish_reason if last else None,
                                         num_tokens == 0))
                        num_tokens += 1
                if finish_reason is not None:
                    if req.include_usage:
                        out.append(sse(usage_chunk(response_id, model_name, created, req.kind,
                                                   usage(prompt_len, num_tokens))))
                    out.append("data: [DONE]\n\n")
                yield "".join(out)
        finally:
            if finish_reason is None:  # the client went away (or the server stops): free its KV now
                thread.abort(stream)

    def chunk(kind: str, response_id: str, created: int, text: str, finish_reason: str | None, first: bool) -> str:
        if kind == CHAT:
            return sse(chat_chunk(response_id, model_name, created, text, finish_reason, first))
        return sse(completion_chunk(response_id, model_name, created, text, finish_reason))

    async def full_completion(http: Request, thread: EngineThread, stream: RequestStream, req: GenerateRequest,
                              prompt_len: int) -> Response:
        """Non-streaming: wait for the last token, unless the client disconnects first."""
        async def collect() -> tuple[list[int], str] | APIError:
            token_ids = []
            while True:
                event = await stream.queue.get()
                if isinstance(event, Rejected):  # the engine thread died
                    return event.error
                token_ids += event.token_ids
                if event.finish_reason is not None:
                    return token_ids, event.finish_reason

        async def disconnected() -> None:
            while (await http.receive())["type"] != "http.disconnect":
                pass

        result, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not result.done():
                result.cancel()
                thread.abort(stream)
        if not result.done() or result.cancelled():
            return Response(status_code=499)  # nginx's "client closed request": nobody reads it
        if isinstance(result.result(), APIError):
            return error_response(result.result())
        token_ids, reason = result.result()
        rid = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{stream.request_id}"
        return JSONResponse(full_response(rid, model_name, now_s(), req.kind, engine.tokenizer.decode(token_ids),
                                          FINISH_REASONS[reason], usage(prompt_len, len(token_ids))))

    @app.post("/v1/completions")
    async def completions(http: Request):
        return await generate(http, COMPLETIONS)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request):
        return await generate(http, CHAT)

    @app.get("/v1/models")
    async def models():
        meta = engine.timeline.meta
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": now_s(),
                                            "owned_by": "minilm", "root": str(meta.get("model", model_name)),
                                            "max_model_len": engine.config.max_model_len,
                                            "policy": meta.get("policy")}]}

    @app.get("/health")
    async def health():
        thread: EngineThread = app.state.engine_thread
        if not thread.alive:
            return error_response(APIError(503, "the engine is not running" if thread.draining_until is None
                                           else "the server is shutting down", type="service_unavailable"))
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/timeline")
    async def timeline(since: int = 0, since_request: int = 0):
        """Timeline records from step `since` and finished request `since_request` on, plus the
        unfinished requests as they are now; taken by the engine thread between two steps."""
        if since < 0 or since_request < 0:
            return error_response(BadRequest(f"since={since}, since_request={since_request}: must be >= 0"))
        thread: EngineThread = app.state.engine_thread
        if not thread.thread.is_alive():
            return error_response(APIError(503, "the engine is not running", type="service_unavailable"))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        thread.send(Snapshot(since, since_request, lambda d: loop.call_soon_threadsafe(future.set_result, d)))
        return await future

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return PAGE.read_text()

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


def serve(args) -> None:
    """`python -m minilm serve ...` (arguments: __main__.py)."""
    from .clock import WallClock
    from .__main__ import engine_config

    config = engine_config(args, args.policy, args.enable_prefix_caching == "on")
    engine = Engine(args.model, config, clock=WallClock(config.device))
    name = args.served_model_name or Path(str(args.model)).name
    app = create_app(engine, name, max_waiting=args.max_waiting, timeline_path=args.timeline,
                     stream_interval=args.stream_interval)
    c = engine.config
    print(f"minilm serve: {name}, policy {engine.policy.name}, "
          f"max_num_seqs {c.max_num_seqs}, max_model_len {c.max_model_len}, {c.num_blocks} KV blocks of "
          f"{c.block_size}; chat template: {CHAT_TEMPLATE_DOC}", file=sys.stderr)
    print(f"minilm serve: page at http://{args.host}:{args.port}/ , OpenAI API at "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        DrainingServer(app, args.host, args.port, args.drain_timeout, args.log_level, args.access_log).run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
