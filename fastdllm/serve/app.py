"""The HTTP side of `fastdllm serve`: OpenAI-compatible endpoints over the scheduler. A request is
validated and converted (protocol.py), submitted as a Job, and answered from the updates the
scheduler's worker thread delivers into this request's asyncio queue: whole (non-streaming) or as
server-sent events, one chunk per finished block (and per step when asked)."""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from . import ollama
from .jobs import Failed, Finished, Job, QueueFull, ShuttingDown, StepUpdate, TextUpdate
from .metrics import CONTENT_TYPE
from .protocol import prepare_chat, prepare_completion
from .requests import ApiError, Prepared, Server, one_line, parse_body
from .responses import CHAT, COMPLETION, Shape, TrimmedText, answer_calls, parses_calls

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
             "/api/generate", "/api/chat", "/api/tags", "/api/show", "/api/ps", "/api/version")
POLL_SECONDS = 0.5          # how often a waiting request looks whether its client is still there
CLIENT_GONE = 499           # nginx's "client closed request": what the metrics count for it


def create_app(lm, scheduler, *, base_cfg, profile_name: str, cli_flags: dict, api_key: str | None, metrics,
               max_body_bytes: int = 1_000_000, name: str | None = None) -> FastAPI:
    server = Server(lm, base_cfg, profile_name, dict(cli_flags), name)
    created = int(time.time())
    # no /docs or /openapi.json: every endpoint but /health sits behind the key
    app = FastAPI(title="fastdllm", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Gate, api_key=api_key, metrics=metrics, max_body_bytes=max_body_bytes)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error_response(e, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        message, param = one_line(e.errors()[0]) if e.errors() else ("invalid request", None)
        return error_response(ApiError(400, message, param=param), request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return error_response(ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code), request.url.path)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):    # a bug: one line here, the traceback in the log
        return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"), request.url.path)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, prepare_chat(await read_json(request, max_body_bytes), server), CHAT)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, prepare_completion(await read_json(request, max_body_bytes), server), COMPLETION)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(server.model_name, created)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != server.model_name:
            raise ApiError(404, f"model '{model_id}' not found", param="model", code="model_not_found")
        return model_card(model_id, created)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": server.model_name, "queue_depth": scheduler.queue_depth}

    @app.get("/metrics")
    async def prometheus():
        metrics.queue_depth(scheduler.queue_depth)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def start(request: Request, prepared: Prepared, job_id: str) -> tuple[Job, Updates]:
        updates = Updates(request)
        job = Job(job_id, prepared.prompt, prepared.cfg, updates.deliver, stop=prepared.stop,
                  steps=prepared.steps, suffix=prepared.suffix, constraint=prepared.constraint)
        try:
            scheduler.submit(job)
        except QueueFull:
            raise ApiError(429, "the server's queue is full; retry later", kind="rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"}) from None
        except ShuttingDown:
            raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down") from None
        return job, updates

    async def follow(job: Job, updates: Updates):
        """A job's updates up to its end (ollama's answers); the job is settled however it ends."""
        try:
            while (update := await updates.next()) is not None:
                yield update
                if isinstance(update, (Finished, Failed)):
                    return
        finally:
            settle(job, updates)

    ollama.add_routes(app, server, start, follow, about=ollama.describe(lm, server.model_name))

    async def answer(request: Request, prepared: Prepared, shape: Shape):
        job, updates = start(request, prepared, shape.new_id())
        if prepared.stream:
            return StreamingResponse(stream(job, updates, prepared, shape), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            update = await updates.last()
        finally:
            settle(job, updates)
        if update is None:
            return Response(status_code=CLIENT_GONE)
        if isinstance(update, Failed):
            return error_response(failure(update))
        return shape.whole(job.id, server.model_name, update, prepared)

    async def stream(job: Job, updates: Updates, prepared: Prepared, shape: Shape):
        """Server-sent events; a client that goes away closes this generator (or is seen by
        `updates`), and the job is cancelled in `finally`."""
        trimmed = TrimmedText() if prepared.plain_chat else None
        chunk = shape.chunker(job.id, server.model_name, prepared)
        calls = shape.chat and parses_calls(prepared)
        try:
            yield sse(chunk.first())
            while (update := await updates.next()) is not None:
                if isinstance(update, StepUpdate):
                    yield sse(chunk.step(update))
                elif isinstance(update, TextUpdate):
                    text = trimmed.feed(update.text) if trimmed else update.text
                    if text and not calls:                  # with tools: held until the answer is whole
                        yield sse(chunk.text(text))
                elif isinstance(update, Failed):
                    yield sse(failure(update).body())
                    yield "data: [DONE]\n\n"
                    return
                else:
                    finish = update.finish_reason
                    if calls:                               # the whole answer: its calls, or its text
                        content, found, finish = answer_calls(update.text, finish, prepared)
                        if content:
                            yield sse(chunk.text(content))
                        for part in chunk.calls(found):
                            yield sse(part)
                    yield sse(chunk.last(finish))
                    if prepared.include_usage:
                        yield sse(chunk.usage(update))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            settle(job, updates)

    def settle(job: Job, updates: "Updates") -> None:
        """The request is over: its job is cancelled unless it finished; its log line is written."""
        updates.close()
        if updates.final is None:
            scheduler.cancel(job.id)
        log(job, updates.final, time.perf_counter() - updates.started)

    return app


class Updates:
    """One job's updates on the event loop's side. `deliver` runs on the scheduler's worker thread;
    `next` waits for the next update and looks at the client between updates (None: it went away)."""

    def __init__(self, request: Request):
        self.request = request
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.final: Finished | Failed | None = None
        self.started = time.perf_counter()
        self._get: asyncio.Future | None = None   # kept across timeouts: a timed-out get never loses an update
        self._checked = self.loop.time()

    def deliver(self, update) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, update)
        except RuntimeError:        # the event loop is closed: nobody is waiting for this answer
            pass

    async def next(self):
        while True:
            if self._get is None:
                self._get = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({self._get}, timeout=POLL_SECONDS)
            update = None
            if done:
                update, self._get = self._get.result(), None
                if isinstance(update, (Finished, Failed)):
                    self.final = update
                    return update               # the answer is whole: sent even to a client that may be gone
            # looked at between updates too: a step stream may never leave a pause
            if self.loop.time() - self._checked >= POLL_SECONDS:
                self._checked = self.loop.time()
                if await self.request.is_disconnected():
                    return None
            if update is not None:
                return update

    async def last(self):
        while (update := await self.next()) is not None:
            if isinstance(update, (Finished, Failed)):
                return update
        return None

    def close(self) -> None:
        if self._get is not None:
            self._get.cancel()


class Gate:
    """Pure ASGI middleware (streams pass through untouched): the API key, the body size announced
    in Content-Length, and the request counter by endpoint and status."""

    def __init__(self, app, *, api_key: str | None, metrics, max_body_bytes: int):
        self.app, self.api_key, self.metrics, self.max_body_bytes = app, api_key, metrics, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ENDPOINTS or path.startswith("/v1/models/") else "other"
        endpoint = "/v1/models" if endpoint.startswith("/v1/models/") else endpoint

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.request(endpoint, message["status"])
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = None
        if self.api_key is not None and path != "/health" and not self.authorized(headers.get("authorization", "")):
            refusal = ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        elif too_large(headers.get("content-length"), self.max_body_bytes):
            refusal = body_too_large(self.max_body_bytes)
        if refusal is not None:
            return await error_response(refusal, path)(scope, receive, counted)
        await self.app(scope, receive, counted)

    def authorized(self, header: str) -> bool:
        scheme, _, key = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key.encode())


def too_large(length: str | None, limit: int) -> bool:
    return length is not None and (not length.isdigit() or int(length) > limit)


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body larger than {limit} bytes", code="request_too_large")


async def read_json(request: Request, limit: int):
    """The body as JSON, read up to `limit` bytes (a chunked body announces no length)."""
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise body_too_large(limit)
    return parse_body(bytes(body))


def error_response(e: ApiError, path: str = "") -> JSONResponse:
    if path.startswith("/api/"):                        # ollama's shape: {"error": "..."}
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def failure(f: Failed) -> ApiError:
    return ApiError(f.status, f.message, kind="invalid_request_error" if f.status < 500 else "server_error",
                    code=f.code)


def model_card(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "fastdllm"}


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def log(job: Job, final, seconds: float) -> None:
    """One line per request that reached the scheduler, on stderr."""
    if isinstance(final, Finished):
        status = f"200 {final.finish_reason}"
        figures = f"prompt {final.prompt_tokens} · completion {final.completion_tokens} · NFE {final.nfe}"
    else:
        status = f"{final.status} {final.message}" if isinstance(final, Failed) else f"{CLIENT_GONE} client gone"
        figures = f"prompt {len(job.prompt)}"
    sys.stderr.write(f"fastdllm serve: {job.id} · {figures} · {seconds:.2f} s · {status}\n")
    sys.stderr.flush()
