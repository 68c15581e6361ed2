"""Structured output through `fastdllm serve`: response_format json_object / json_schema (OpenAI's
shape) and the fastdllm regex/grammar extension. The request checks run in this process (fast);
the answers come from a real server process, spoken to with the openai client (slow lane)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.decode.config import DecodeConfig  # noqa: E402
from fastdllm.serve.protocol import prepare_chat, prepare_completion  # noqa: E402
from fastdllm.serve.errors import ApiError  # noqa: E402
from fastdllm.serve.server import Server  # noqa: E402

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 99999}},
          "required": ["city", "population"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def server(llada_dir):
    lm = loading.load(llada_dir, dtype="fp32")
    return Server(lm, DecodeConfig(gen_len=64), "default", {})


def chat_body(**extra) -> dict:
    return {"model": "tiny-llada", "messages": [{"role": "user", "content": "A city?"}], "max_tokens": 64, **extra}


def test_a_request_compiles_its_constraint(server):
    prepared = prepare_chat(chat_body(response_format=RESPONSE_FORMAT), server)
    assert prepared.constraint is not None and prepared.constraint.spec.kind == "json_schema"
    assert prepare_chat(chat_body(response_format={"type": "text"}), server).constraint is None
    regex = prepare_completion({"model": "tiny-llada", "prompt": "x", "fastdllm": {"regex": "[a-z]+"}}, server)
    assert regex.constraint.spec.kind == "regex" and regex.cfg.gen_len == 64   # the key is not a decoding setting


@pytest.mark.parametrize("extra, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format.json_schema.schema", "Unimplemented keys"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "expected a JSON Schema object"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "is not one of"),
    ({"fastdllm": {"regex": "a("}}, "fastdllm.regex", "unclosed group"),
    ({"fastdllm": {"grammar": "start: foo\n"}}, "fastdllm.grammar", "unknown name"),
    ({"fastdllm": {"regex": "a"}, "response_format": {"type": "json_object"}}, "response_format", "give one of them"),
    ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop", "not combined"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(server, extra, param, message):
    with pytest.raises(ApiError) as e:
        prepare_chat(chat_body(**extra), server)
    body = e.value.body()["error"]
    assert e.value.status == 400 and body["param"] == param and message in body["message"]
    assert "\n" not in body["message"] and body["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def served():
    from serve_process import ServerProcess

    process = ServerProcess("--dtype", "fp32", "--cache", "prefix")
    yield process
    assert process.stop() == 0, process.log


@pytest.mark.slow
def test_served_answers_validate(served):
    client = openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Name a city and its population."}]
    r = client.chat.completions.create(model="tiny-code", messages=messages, max_tokens=64,
                                       response_format=RESPONSE_FORMAT)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="tiny-code", messages=messages, max_tokens=64,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":           # any object: a string may outrun 64 tokens
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")
    r = client.completions.create(model="tiny-code", prompt="def add(a, b):", max_tokens=32,
                                  extra_body={"fastdllm": {"regex": r"(yes|no), [0-9]{1,2}"}})
    assert re.fullmatch(r"(yes|no), [0-9]{1,2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model="tiny-code", messages=messages, max_tokens=64, stream=True,
                                            response_format=RESPONSE_FORMAT)
    chunks = list(stream)
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), SCHEMA)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-code", messages=messages, max_tokens=64,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                                           "type": "integer", "minimum": 5, "maximum": 1}}})
    assert "Unsatisfiable schema" in e.value.body["message"]
    print("served:", r.choices[0].text, "|", chunks and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
