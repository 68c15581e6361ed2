"""Structured output asked the ollama way (`format`: "json" or a JSON Schema) and a structured
request on a server without llguidance: a 400 naming what to install, never a 5xx (which the
openai client retries). The app runs in this process over the built-in model (Starlette's
TestClient), with the real scheduler."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.checkpoints.builtin import NAME, builtin_model_path  # noqa: E402
from fastdllm.decode.config import DecodeConfig  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def client():
    from fastdllm.serve.app import create_app
    from fastdllm.serve.metrics import Metrics
    from fastdllm.serve.scheduler import Scheduler

    lm = loading.load(builtin_model_path(), dtype="fp32")
    metrics = Metrics()
    scheduler = Scheduler(lm.decoder, metrics=metrics)
    scheduler.start()
    app = create_app(lm, scheduler, base_cfg=DecodeConfig(gen_len=64), profile_name="default", cli_flags={},
                     api_key=None, metrics=metrics, name=NAME)
    yield TestClient(app)
    scheduler.shutdown()


def ask(client, path: str, **fields):
    body = {"model": NAME, "stream": False, "options": {"num_predict": 64}, **fields}
    if path == "/api/chat":
        body["messages"] = [{"role": "user", "content": "A name as JSON."}]
    else:
        body["prompt"] = "A name as JSON:"
    return client.post(path, json=body)


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_format_json_and_a_schema_constrain_the_answer(client, path):
    r = ask(client, path, format=SCHEMA)
    assert r.status_code == 200, r.text
    reply = r.json()
    text = reply["message"]["content"] if path == "/api/chat" else reply["response"]
    if reply["done_reason"] == "stop":          # a whole sentence of the schema
        assert set(json.loads(text)) == {"name"}
    else:                                       # the canvas ran out: a prefix of one
        assert text.lstrip().startswith("{")
    r = ask(client, path, format="json")
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("fmt, message", [("yaml", 'format: expected "json" or a JSON Schema object'),
                                          ({"not": {}}, "format: JSON Schema: Unimplemented keys")])
def test_a_bad_format_is_a_400_naming_format(client, fmt, message):
    r = ask(client, "/api/chat", format=fmt)
    assert r.status_code == 400 and r.json()["error"].startswith(message), r.text


def test_without_llguidance_a_structured_request_is_a_400_naming_the_extra(client, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)          # import llguidance: ImportError
    r = client.post("/v1/chat/completions", json={
        "model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "response_format.json_schema.schema"
    assert "llguidance" in error["message"] and "fastdllm[structured]" in error["message"]
    assert "\n" not in error["message"]
    r = ask(client, "/api/generate", format="json")
    assert r.status_code == 400 and r.json()["error"].startswith("format: structured output needs llguidance")
