"""`fastdllm serve` as a client sees it: a real server process on a free loopback port, spoken to
with the openai client and raw HTTP. float64 everywhere, so answers can be compared exactly with
`fastdllm generate --json`. The scheduler's own tests (batching, joining) are in test_scheduler.py."""

from __future__ import annotations

import json
import re
import signal
import socket

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from serve_process import ServerProcess  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from fastdllm.cli.app import app  # noqa: E402
from fastdllm.checkpoints.builtin import NAME as BUILTIN  # noqa: E402

KEY = "test-key-123"
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def builtin_server():
    """The built-in tiny code model (no chat template), the server's defaults."""
    server = ServerProcess("--dtype", "fp64")
    yield server
    assert server.stop() == 0, server.log


@pytest.fixture(scope="module")
def llada_server(llada_dir):
    """A tiny LLaDA with its real chat template, behind an API key."""
    server = ServerProcess("-m", llada_dir, "--dtype", "fp64", "--api-key", KEY)
    yield server
    assert server.stop() == 0, server.log


def client(server: ServerProcess, key: str = "unused") -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=120)


def generate_json(*args) -> dict:
    """`fastdllm generate --dtype fp64 --json ARGS`, in this process."""
    r = CliRunner().invoke(app, ["generate", "--dtype", "fp64", "--json", *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def sse_events(response) -> list:
    """The `data:` payloads of a server-sent event stream, decoded ('[DONE]' kept as a string)."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ---------------------------------------------------------------- answers

def test_completion_equals_generate_and_says_max_tokens_was_rounded(builtin_server):
    answer = client(builtin_server).completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=20)
    record = generate_json("--raw", "-n", "32", PROMPT)     # 20 rounded up to one block of 32
    extra = answer.model_extra["fastdllm"]
    assert extra["max_tokens"] == 20 and extra["canvas_tokens"] == 32
    assert "rounded up to whole blocks of 32" in extra["note"]
    assert extra["completion_ids"] == record["ids"]
    assert answer.choices[0].text == record["text"]
    assert answer.choices[0].finish_reason == ("length" if len(record["ids"]) == 32 else "stop")
    usage = answer.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (record["prompt_tokens"], record["generated_tokens"])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.nfe == record["nfe"] and usage.tokens_per_forward == record["tokens_per_forward"]
    assert answer.object == "text_completion" and answer.model == BUILTIN


def test_completion_stream_joins_to_the_whole_answer(builtin_server):
    c = client(builtin_server)
    whole = c.completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=32)
    chunks = list(c.completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=32, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    *_, last, tail = chunks
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert tail.choices == [] and tail.usage.completion_tokens == whole.usage.completion_tokens
    assert tail.usage.nfe == whole.usage.nfe


def test_step_stream_reports_every_commit(builtin_server):
    whole = client(builtin_server).completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=32,
                                                       extra_body={"fastdllm": {"threshold": 0.5}})
    body = {"model": BUILTIN, "prompt": PROMPT, "max_tokens": 32, "stream": True,
            "stream_options": {"include_usage": True}, "fastdllm": {"steps": True, "threshold": 0.5}}
    with httpx.stream("POST", builtin_server.v1 + "/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    steps = [e["fastdllm"]["step"] for e in events[:-1] if "step" in e.get("fastdllm", {})]
    assert all(e["choices"][0]["text"] == "" for e in events[:-1] if "step" in e.get("fastdllm", {}))
    usage = events[-2]["usage"]
    assert len(steps) == usage["nfe"] == whole.usage.nfe
    decided = {p: t for s in steps for p, t in zip(s["positions"], s["tokens"])}
    ids = whole.model_extra["fastdllm"]["completion_ids"]
    assert all(decided[p] == t for p, t in enumerate(ids))                     # each answer token, as committed
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == whole.choices[0].text


def test_suffix_fills_the_middle_as_generate_suffix_does(builtin_server):
    suffix = "\n    return total\n"
    c = client(builtin_server)
    whole = c.completions.create(model=BUILTIN, prompt=PROMPT + "\n", suffix=suffix, max_tokens=20)
    record = generate_json("-n", "32", "--suffix", suffix, PROMPT + "\n")     # 20: one block of 32
    assert whole.choices[0].text == record["middle"]
    assert whole.model_extra["fastdllm"]["completion_ids"] == record["holes"][0]["ids"]
    assert whole.usage.completion_tokens == record["generated_tokens"] and whole.usage.nfe == record["nfe"]
    assert whole.usage.prompt_tokens == record["prompt_tokens"]                # prompt and suffix
    chunks = list(c.completions.create(model=BUILTIN, prompt=PROMPT + "\n", suffix=suffix, max_tokens=20,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == record["middle"]


def test_chat_without_a_template_is_a_plain_transcript(builtin_server):
    c = client(builtin_server)
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": PROMPT}]
    whole = c.chat.completions.create(model=BUILTIN, messages=messages, max_tokens=32)
    content = whole.choices[0].message.content
    assert content == content.strip() and "\nUser:" not in content
    assert whole.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model=BUILTIN, messages=messages, max_tokens=32, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == content


def test_chat_with_template_equals_generate_and_streams(llada_server, llada_dir):
    c = client(llada_server, KEY)
    name = llada_dir.name
    whole = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hello there"}],
                                      max_tokens=32, extra_body={"fastdllm": {"block_len": 16, "threshold": 0.5}})
    record = generate_json("-m", llada_dir, "-n", "32", "--block-len", "16", "--threshold", "0.5", "Hello there")
    assert whole.model_extra["fastdllm"]["completion_ids"] == record["ids"]
    assert whole.choices[0].message.content == record["text"]
    assert whole.usage.prompt_tokens == record["prompt_tokens"] and whole.usage.nfe == record["nfe"]
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]
    chunks = list(c.chat.completions.create(model=name, messages=[{"role": "user", "content": parts}],
                                            max_tokens=32, stream=True, stream_options={"include_usage": True},
                                            extra_body={"fastdllm": {"block_len": 16, "threshold": 0.5}}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == record["text"]
    assert chunks[-1].usage.nfe == record["nfe"] and chunks[-1].usage.completion_tokens == record["generated_tokens"]


# ---------------------------------------------------------------- endpoints

def test_models_health_and_metrics(builtin_server):
    c = client(builtin_server)
    c.completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=8)
    assert [m.id for m in c.models.list()] == [BUILTIN]
    assert c.models.retrieve(BUILTIN).id == BUILTIN
    health = httpx.get(builtin_server.url + "/health").json()
    assert health["status"] == "ok" and health["model"] == BUILTIN
    text = httpx.get(builtin_server.url + "/metrics").text
    assert 'fastdllm_requests_total{endpoint="/v1/completions",status="200"}' in text
    for name in ("fastdllm_generated_tokens_total", "fastdllm_nfe_total", "fastdllm_forwards_total",
                 "fastdllm_committed_positions_total", "fastdllm_tokens_per_forward"):
        value = float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))
        assert value > 0, name
    assert "fastdllm_forward_seconds_bucket" in text and "fastdllm_batch_rows_bucket" in text
    assert re.search(r"^fastdllm_queue_depth 0\.0$", text, re.M)


BAD = [  # (path, body: dict or raw bytes, status, words the one-line message must contain)
    ("/completions", b'{"model": "tiny-code", "prompt": ', 400, "not valid JSON"),
    ("/completions", b"[1, 2]", 400, "JSON object"),
    ("/completions", {"prompt": PROMPT}, 400, "model"),
    ("/completions", {"model": "gpt-4", "prompt": PROMPT}, 404, "not found"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "max_tokens": 10**9}, 400, "context"),
    ("/completions", {"model": BUILTIN, "prompt": [272] * 5000, "max_tokens": 32}, 400, "context"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "temperature": -1}, 400, "temperature"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "n": 2}, 400, "n=1"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "top_p": 0.5}, 400, "top_p"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "logprobs": 3}, 400, "logprobs"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "suffix": 5}, 400, "suffix: expected a string"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "suffix": "x", "max_tokens": 4090}, 400,
     "the suffix (1 tokens)"),
    ("/completions", {"model": BUILTIN, "prompt": [PROMPT, PROMPT]}, 400, "one per request"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": {"threshold": 2}}, 400, "threshold"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": {"treshold": 0.5}}, 400, "did you mean"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": {"cache": "big"}}, 400, "cache"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": {"profile": "nope"}}, 400, "unknown profile"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": {"profile": "/etc/passwd"}}, 400, "unknown profile"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": {"gen_len": 64}}, 400, "max_tokens"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "max_tokens": 64,
                      "fastdllm": {"rule": "fixed", "steps": 7}}, 400, "divisible"),
    ("/completions", {"model": BUILTIN, "prompt": PROMPT, "fastdllm": "fast"}, 400, "fastdllm"),
    ("/chat/completions", {"model": BUILTIN, "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/chat/completions", {"model": BUILTIN, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text parts"),
    ("/chat/completions", {"model": BUILTIN, "messages": []}, 400, "messages"),
    ("/completions", b'{"model": "tiny-code", "prompt": "' + b"a" * 1_100_000 + b'"}', 413, "larger than"),
]


def test_bad_requests_get_a_one_line_error_and_the_server_goes_on(builtin_server):
    with httpx.Client(base_url=builtin_server.v1, timeout=60) as http:
        for path, body, status, words in BAD:
            r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
            error = r.json()["error"]
            assert (r.status_code, words in error["message"]) == (status, True), (body if isinstance(body, dict)
                                                                                    else body[:60], r.text)
            assert "\n" not in error["message"] and error["type"] and "param" in error and "code" in error
        assert http.post("/completions", json={"model": "nope", "prompt": "x"}).json()["error"]["code"] == \
            "model_not_found"
        assert http.post("/completions", json={"model": BUILTIN, "prompt": "x", "max_tokens": 4096}) \
            .json()["error"]["code"] == "context_length_exceeded"
        assert http.get("/no-such-endpoint").status_code == 404
        good = http.post("/completions", json={"model": BUILTIN, "prompt": PROMPT, "max_tokens": 8,
                                               "fastdllm": {"profile": "fast", "steps": False}})
        assert good.status_code == 200 and good.json()["fastdllm"]["profile"] == "fast"


def test_client_leaving_mid_stream_cancels_its_job(builtin_server):
    body = {"model": BUILTIN, "prompt": PROMPT, "max_tokens": 128, "stream": True,
            "fastdllm": {"steps": True, "early_stop": False}}
    with httpx.stream("POST", builtin_server.v1 + "/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                job_id = json.loads(line[6:])["id"]
            if '"step"' in line:
                break                                      # decoding has begun: hang up
    builtin_server.wait_for_log(rf"{job_id} .*499 client gone")
    answer = client(builtin_server).completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=8)
    assert answer.usage.completion_tokens <= 32


def test_api_key_is_required_except_for_health(llada_server, llada_dir):
    name = llada_dir.name
    with pytest.raises(openai.AuthenticationError):
        client(llada_server, "wrong-key").models.list()
    r = httpx.post(llada_server.v1 + "/chat/completions", json={"model": name, "messages": []})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(llada_server.url + "/metrics").status_code == 401
    assert httpx.get(llada_server.url + "/health").status_code == 200
    assert [m.id for m in client(llada_server, KEY).models.list()] == [name]


# ---------------------------------------------------------------- process

def test_sigterm_lets_the_running_request_finish_and_exits_0(llada_dir):
    server = ServerProcess("-m", llada_dir, "--dtype", "fp64", "--cache", "none", "--rule", "fixed",
                           "--shutdown-timeout", "120")     # abort after the wait: test_serve_shutdown.py
    try:
        body = {"model": llada_dir.name, "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 64, "stream": True, "fastdllm": {"early_stop": False}}
        events = []
        with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if not events:
                        server.proc.send_signal(signal.SIGTERM)     # the request is running
                    events.append(line[6:])
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
        assert server.proc.wait(60) == 0, server.log
    finally:
        server.stop()


def test_non_loopback_host_needs_a_key():
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0"], env={"FASTDLLM_API_KEY": ""})
    assert r.exit_code == 2
    assert "--api-key" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_busy_port_is_a_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = CliRunner().invoke(app, ["serve", "--port", str(taken.getsockname()[1])])
    assert r.exit_code == 1
    assert "cannot listen on 127.0.0.1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
