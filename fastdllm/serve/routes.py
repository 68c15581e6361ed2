"""The OpenAI endpoints (/v1/chat/completions, /v1/completions, /v1/models) and /health, /metrics,
as module-level routes on `router`; what they serve is the app's state (`request.app.state`: the
Server, the scheduler, the metrics; app.py sets it). A request is validated and converted
(protocol.py), submitted as a Job (updates.py), and answered whole or as server-sent events, one
chunk per finished block (and per step when asked)."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .errors import ApiError
from .jobs import Failed, Job, StepUpdate, TextUpdate
from .metrics import CONTENT_TYPE
from .protocol import prepare_chat, prepare_completion
from .responses import CHAT, COMPLETION, Shape, TrimmedText, answer_calls, parses_calls
from .schemas import parse_body
from .server import Prepared
from .updates import CLIENT_GONE, Updates, settle, start

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state = request.app.state
    return await answer(request, prepare_chat(await read_json(request, state.max_body_bytes), state.server), CHAT)


@router.post("/v1/completions")
async def completions(request: Request):
    state = request.app.state
    return await answer(request, prepare_completion(await read_json(request, state.max_body_bytes), state.server),
                        COMPLETION)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state
    return {"object": "list", "data": [model_card(state.server.model_name, state.created)]}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str):
    state = request.app.state
    if model_id != state.server.model_name:
        raise ApiError(404, f"model '{model_id}' not found", param="model", code="model_not_found")
    return model_card(model_id, state.created)


@router.get("/health")
async def health(request: Request):
    state = request.app.state
    return {"status": "ok", "model": state.server.model_name, "queue_depth": state.scheduler.queue_depth}


@router.get("/metrics")
async def prometheus(request: Request):
    state = request.app.state
    state.metrics.queue_depth(state.scheduler.queue_depth)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


async def answer(request: Request, prepared: Prepared, shape: Shape):
    job, updates = start(request, prepared, shape.new_id())
    name = request.app.state.server.model_name
    if prepared.stream:
        return StreamingResponse(stream(job, updates, prepared, shape, name), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        update = await updates.last()
    finally:
        settle(job, updates)
    if update is None:
        return Response(status_code=CLIENT_GONE)
    if isinstance(update, Failed):
        return error_response(failure(update))
    return shape.whole(job.id, name, update, prepared)


async def stream(job: Job, updates: Updates, prepared: Prepared, shape: Shape, name: str):
    """Server-sent events; a client that goes away closes this generator (or is seen by
    `updates`), and the job is cancelled in `finally`."""
    trimmed = TrimmedText() if prepared.plain_chat else None
    chunk = shape.chunker(job.id, name, prepared)
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
