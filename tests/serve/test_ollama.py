"""ollama's API in `fastdllm serve`, spoken by the `ollama` Python client to a real server process:
a conversation streamed as NDJSON, generate whole and streamed, tags / show / ps / version, errors
in ollama's shape; and `fastdllm ps` reading the same server."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from serve_process import ServerProcess
from fastdllm.checkpoints.builtin import NAME as BUILTIN

ollama = pytest.importorskip("ollama")


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--dtype", "fp64", "--seed", "0")
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


@pytest.mark.slow
def test_a_conversation_streams_as_ndjson_and_ends_with_the_counts(client, server):
    messages = [{"role": "user", "content": "def fibonacci(n):"}]
    parts = list(client.chat(model=BUILTIN, messages=messages, stream=True, options={"num_predict": 64}))
    assert len(parts) >= 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    answer = "".join(p.message.content for p in parts)
    assert answer.strip() and parts[-1].done_reason in ("stop", "length")
    assert 0 < parts[-1].eval_count <= 64 and parts[-1].prompt_eval_count > 0 and parts[-1].total_duration > 0
    # the next turn carries the answer back, as an ollama chat loop does
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and in C?"}]
    whole = client.chat(model=BUILTIN, messages=messages, options={"num_predict": 32, "seed": 1})
    assert whole.done and whole.message.role == "assistant" and whole.message.content.strip()
    # the same request through the raw endpoint: one JSON object a line
    with httpx.stream("POST", server.url + "/api/chat", json={"model": BUILTIN, "messages": messages[:1],
                                                              "options": {"num_predict": 32}}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])


@pytest.mark.slow
def test_generate_whole_equals_generate_streamed(client):
    request = dict(model=BUILTIN, prompt="def add(a, b):", options={"num_predict": 32, "temperature": 0})
    whole = client.generate(**request)
    streamed = list(client.generate(**request, stream=True))
    assert whole.done and whole.response == "".join(p.response for p in streamed)
    assert whole.eval_count == streamed[-1].eval_count


def test_tags_show_ps_and_version_describe_the_served_model(client):
    (tag,) = client.list().models
    assert tag.model == BUILTIN and tag.details.family == "llada" and tag.size > 10**6
    shown = client.show(BUILTIN)
    assert shown.modelinfo["general.architecture"] == "llada" and shown.modelinfo["general.parameter_count"] > 10**6
    (loaded,) = client.ps().models
    assert loaded.model == BUILTIN and loaded.size_vram == 0 and loaded.details.quantization_level == "FLOAT64"
    assert httpx.get(client._client.base_url.join("/api/version")).json()["version"]


def test_errors_come_in_ollamas_shape(client, server):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "model 'llama3' not found" in missing.value.error
    with pytest.raises(ollama.ResponseError) as option:
        client.generate(model=BUILTIN, prompt="x", options={"top_k": 3})
    assert option.value.status_code == 400 and option.value.error.startswith("options.top_k: not supported")
    bad = httpx.post(server.url + "/api/generate", json={"model": BUILTIN, "prompt": "x", "options": {"num_predict": "many"}})
    assert bad.status_code == 400 and bad.json()["error"].startswith("max_tokens:")
    assert httpx.post(server.url + "/api/show", json={"model": "nope"}).json() == {
        "error": f"model 'nope' not found (this server serves '{BUILTIN}')"}


def test_fastdllm_ps_reads_the_running_server(server):
    from fastdllm.cli.app import app

    port = server.url.rsplit(":", 1)[1]
    out = CliRunner().invoke(app, ["ps", "--port", port])
    assert out.exit_code == 0
    header, row = out.stdout.splitlines()
    assert header.split() == ["NAME", "FAMILY", "SIZE", "PRECISION", "PROCESSOR", "CONTEXT"]
    assert row.split()[:2] == [BUILTIN, "llada"] and "float64" in row and "CPU" in row
