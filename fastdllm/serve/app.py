"""The HTTP side of `fastdllm serve`: one FastAPI app whose state holds what the routes serve
(the Server, the scheduler, the metrics, the body limit, ollama's model description), the OpenAI
routes (routes.py) and ollama's (ollama.py), one error shape for every refusal, and the Gate
middleware (API key, body size, request counter)."""

from __future__ import annotations

import hmac
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from . import ollama, routes
from .errors import ApiError
from .routes import body_too_large, error_response
from .schemas import one_line
from .server import Server

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
             "/api/generate", "/api/chat", "/api/tags", "/api/show", "/api/ps", "/api/version")


def create_app(lm, scheduler, *, base_cfg, profile_name: str, cli_flags: dict, api_key: str | None, metrics,
               max_body_bytes: int = 1_000_000, name: str | None = None) -> FastAPI:
    # no /docs or /openapi.json: every endpoint but /health sits behind the key
    app = FastAPI(title="fastdllm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = Server(lm, base_cfg, profile_name, dict(cli_flags), name)
    app.state.scheduler, app.state.metrics, app.state.max_body_bytes = scheduler, metrics, max_body_bytes
    app.state.created = int(time.time())
    app.state.about = ollama.describe(lm, app.state.server.model_name)
    app.add_middleware(Gate, api_key=api_key, metrics=metrics, max_body_bytes=max_body_bytes)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    app.include_router(routes.router)
    app.include_router(ollama.router)
    return app


async def api_error(request: Request, e: ApiError):
    return error_response(e, request.url.path)


async def validation_error(request: Request, e: RequestValidationError):
    message, param = one_line(e.errors()[0]) if e.errors() else ("invalid request", None)
    return error_response(ApiError(400, message, param=param), request.url.path)


async def http_error(request: Request, e: HTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    return error_response(ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code),
                          request.url.path)


async def server_error(request: Request, e: Exception):    # a bug: one line here, the traceback in the log
    return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"),
                          request.url.path)


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
