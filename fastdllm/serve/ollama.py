"""ollama's API beside OpenAI's (github.com/ollama/ollama docs/api.md): /api/generate and /api/chat
(NDJSON streams, one object per finished block, the last with `done` and the counts), /api/tags,
/api/show, /api/ps, /api/version. A request is turned into the OpenAI request it means and goes
through the same validation (protocol.py) and scheduler; only the answer's shape differs. The
routes are module-level on `router`; what they serve is the app's state (app.py)."""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .errors import ApiError
from .jobs import Failed, Finished, TextUpdate
from .protocol import prepare_chat, prepare_completion
from .responses import TrimmedText
from .schemas import parse_body
from .updates import follow, start

# ollama's options fastdllm decodes with, and the OpenAI field each becomes
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "seed": "seed", "stop": "stop"}
NEVER_UNLOADED = "2999-12-31T23:59:59Z"     # /api/ps: a served model stays loaded while the server runs

router = APIRouter()


@router.post("/api/chat")
async def chat(request: Request):
    server = request.app.state.server
    body = await read_body(request)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ApiError(400, "messages: a list of {role, content} is required", param="messages")
    refuse_unsupported(body, ("tools",))
    if any(isinstance(m, dict) and m.get("images") for m in messages):
        raise ApiError(400, "messages.images: fastdllm serves text models", param="messages")
    openai = {"messages": [{"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m
                           for m in messages], **common(body, server), "response_format": response_format(body)}
    with format_named():
        prepared = prepare_chat(openai, server)
    return await answer(request, prepared, body, chat=True)


@router.post("/api/generate")
async def generate(request: Request):
    server = request.app.state.server
    body = await read_body(request)
    refuse_unsupported(body, ("images", "context", "template"))
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt: must be a string", param="prompt")
    if not prompt and not body.get("suffix"):             # ollama: an empty prompt loads the model
        return JSONResponse(final_fields(server.model_name, {"response": "", "done": True, "done_reason": "load"}))
    system, structured = body.get("system"), response_format(body)
    with format_named():
        if body.get("raw") or body.get("suffix") is not None or not server.lm.has_chat_template:
            text = f"{system}\n\n{prompt}" if system else prompt
            openai = {"prompt": text, "suffix": body.get("suffix"), **common(body, server)}
            prepared = prepare_completion(openai, server, response_format=structured)
        else:                                             # ollama applies the model's template
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            prepared = prepare_chat({"messages": messages, **common(body, server), "response_format": structured},
                                    server)
    return await answer(request, prepared, body, chat=False)


async def answer(request: Request, prepared, body: dict, *, chat: bool):
    name = request.app.state.server.model_name
    job, updates = start(request, prepared, ("ollama-chat-" if chat else "ollama-gen-") + str(time.time_ns()))
    trimmed = TrimmedText() if prepared.plain_chat else None

    def piece(text: str) -> dict:
        return {"model": name, "created_at": now(),
                **({"message": {"role": "assistant", "content": text}} if chat else {"response": text}), "done": False}

    def last(update, text: str = "") -> dict:
        if isinstance(update, Failed):
            return {"error": update.message}
        return {**piece(text), "done": True, "done_reason": update.finish_reason, **counts(update)}

    if body.get("stream", True):                          # ollama streams unless told not to
        async def lines():
            async for update in follow(job, updates):
                if isinstance(update, TextUpdate):
                    text = trimmed.feed(update.text) if trimmed else update.text
                    if text:
                        yield json.dumps(piece(text), ensure_ascii=False) + "\n"
                elif isinstance(update, (Finished, Failed)):
                    yield json.dumps(last(update), ensure_ascii=False) + "\n"
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    final = None
    async for update in follow(job, updates):
        if isinstance(update, (Finished, Failed)):
            final = update
    if isinstance(final, Failed):
        return JSONResponse({"error": final.message}, status_code=final.status)
    if final is None:
        return JSONResponse({"error": "client gone"}, status_code=499)
    text = final.text.strip() if prepared.plain_chat else final.text
    return JSONResponse(last(final, text))


@router.get("/api/tags")
async def tags(request: Request):
    server, about = request.app.state.server, request.app.state.about
    return {"models": [{"name": server.model_name, "model": server.model_name, "modified_at": about["modified_at"],
                        "size": about["size"], "digest": about["digest"], "details": details(about)}]}


@router.post("/api/show")
async def show(request: Request):
    server, about = request.app.state.server, request.app.state.about
    body = await read_body(request)
    wanted = body.get("model") or body.get("name")
    if not matches(wanted, server.model_name):
        raise not_found(wanted, server.model_name)
    return {"modelfile": "", "parameters": "", "template": about.get("template") or "", "license": about.get("license", ""),
            "details": details(about), "capabilities": ["completion"], "modified_at": about["modified_at"],
            "model_info": {"general.architecture": about["family"], "general.parameter_count": about["parameters"],
                           f"{about['family']}.context_length": about["context"]}}


@router.get("/api/ps")
async def ps(request: Request):
    server, about = request.app.state.server, request.app.state.about
    return {"models": [{"name": server.model_name, "model": server.model_name, "size": about["size"],
                        "digest": about["digest"], "details": details(about), "expires_at": NEVER_UNLOADED,
                        "size_vram": about["size_vram"], "context_length": about["context"]}]}


@router.get("/api/version")
async def version(request: Request):
    return {"version": request.app.state.about["version"]}


async def read_body(request: Request) -> dict:
    body = parse_body(await request.body() or b"{}")
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def common(body: dict, server) -> dict:
    """The OpenAI fields of an ollama request: the model, stream, and the options fastdllm takes."""
    wanted = body.get("model")
    if not matches(wanted, server.model_name):
        raise not_found(wanted, server.model_name)
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "options: must be an object", param="options")
    if unknown := sorted(set(options) - set(OPTIONS)):
        raise ApiError(400, f"options.{unknown[0]}: not supported (fastdllm takes {', '.join(OPTIONS)})",
                       param=f"options.{unknown[0]}")
    openai: dict[str, Any] = {"model": server.model_name, "stream": False}
    for key, field in OPTIONS.items():
        value = options.get(key)
        no_limit = key == "num_predict" and isinstance(value, int) and value < 0     # ollama's -1: the default
        if value is not None and not no_limit:
            openai[field] = value                   # validated as the OpenAI field (a wrong type: 400)
    return openai


def response_format(body: dict) -> dict | None:
    """ollama's `format` as OpenAI's response_format: "json" is any JSON object, an object is a JSON
    Schema; both constrain the answer (ollama does the same with a grammar)."""
    wanted = body.get("format")
    if wanted in (None, ""):
        return None
    if wanted == "json":
        return {"type": "json_object"}
    if isinstance(wanted, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": wanted}}
    raise ApiError(400, 'format: expected "json" or a JSON Schema object', param="format")


@contextmanager
def format_named():
    """A refusal of the response_format made from `format` names `format`, the field that was sent."""
    def named(text: str | None) -> str | None:
        return text and text.replace("response_format.json_schema.schema", "format").replace("response_format", "format")

    try:
        yield
    except ApiError as e:
        e.message, e.param = named(e.message), named(e.param)
        raise


def refuse_unsupported(body: dict, names: tuple[str, ...]) -> None:
    for name in names:
        if body.get(name):
            raise ApiError(400, f"{name}: not supported by fastdllm", param=name)


def matches(wanted: Any, served: str) -> bool:
    """ollama adds ':latest' to a name without a tag."""
    return isinstance(wanted, str) and wanted in (served, f"{served}:latest")


def not_found(wanted: Any, served: str) -> ApiError:
    return ApiError(404, f"model '{wanted}' not found (this server serves '{served}')", param="model",
                    code="model_not_found")


def counts(f: Finished) -> dict:
    """ollama's counters, in nanoseconds; fastdllm decodes prompt and answer together, so the time
    after the queue is all eval time."""
    total = int(f.seconds * 1e9)
    return {"total_duration": total, "load_duration": 0, "prompt_eval_count": f.prompt_tokens,
            "prompt_eval_duration": 0, "eval_count": f.completion_tokens,
            "eval_duration": int((f.seconds - f.queued_seconds) * 1e9)}


def final_fields(model: str, fields: dict) -> dict:
    return {"model": model, "created_at": now(), **fields}


def details(about: dict) -> dict:
    return {"parent_model": "", "format": "safetensors", "family": about["family"], "families": [about["family"]],
            "parameter_size": about["parameter_size"], "quantization_level": about["quantization"]}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def describe(lm, name: str) -> dict:
    """The served model as /api/tags, /api/show and /api/ps report it (read once, at start)."""
    from importlib.metadata import PackageNotFoundError, version

    from ..checkpoints import catalog

    try:
        ours = version("fastdllm")
    except PackageNotFoundError:       # run from a source tree that was never installed
        ours = "unknown"

    parameters = sum(p.numel() for p in lm.model.parameters())
    size = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    config = (lm.path / "config.json").read_bytes()
    entry = catalog.lookup(name)
    on_gpu = lm.device.type == "cuda"
    return {"family": json.loads(config).get("model_type", "?"), "parameters": parameters,
            "parameter_size": f"{parameters / 1e9:.1f}B" if parameters >= 1e8 else f"{parameters / 1e6:.1f}M",
            "quantization": (lm.quantize if lm.quantize != "none" else str(lm.dtype).replace("torch.", "")).upper(),
            "size": size, "size_vram": size if on_gpu else 0, "context": lm.context_length,
            "digest": hashlib.sha256(config).hexdigest(),   # of config.json: names this checkpoint's shape
            "modified_at": datetime.fromtimestamp((lm.path / "config.json").stat().st_mtime, timezone.utc).isoformat(),
            "license": entry.license if entry else "", "template": getattr(lm.tokenizer, "chat_template", None) or "",
            "version": ours}
