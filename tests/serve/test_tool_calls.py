"""Tool calls in `fastdllm serve` (serve/tools.py) on a tiny Dream and a tiny LLaDA2 with their real
chat templates (both write Qwen's <tool_call> syntax): request checks, rendering and parsing in this process (fast); calls
through the openai client against a real server process (slow lane)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.decode.config import DecodeConfig  # noqa: E402
from fastdllm.serve.protocol import prepare_chat  # noqa: E402
from fastdllm.serve.errors import ApiError  # noqa: E402
from fastdllm.serve.responses import Chunker  # noqa: E402
from fastdllm.serve.server import Server  # noqa: E402
from fastdllm.serve.tools import GEMMA4, QWEN, parse_calls, syntax_of, tools_of  # noqa: E402

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "Weather in Paris for 2 days?"}]


@pytest.fixture(scope="module")
def server(dream_dir):
    return Server(loading.load(dream_dir, dtype="fp32"), DecodeConfig(gen_len=64), "default", {})


def body(**extra) -> dict:
    return {"model": "tiny-dream", "messages": ASK, "max_tokens": 64, "tools": TOOLS, **extra}


def test_tools_are_rendered_and_a_required_call_is_constrained(server):
    p = prepare_chat(body(tool_choice="required"), server)
    prompt = server.lm.tokenizer.decode(p.prompt)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert p.constraint is not None and p.constraint.spec.kind == "grammar"
    assert prepare_chat(body(tool_choice="auto"), server).constraint is None
    assert prepare_chat(body(tool_choice="none"), server).constraint is None


def test_a_tool_result_is_fed_back_through_the_template(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris", "days": 2}'}}
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    p = prepare_chat(body(messages=messages), server)
    prompt = server.lm.tokenizer.decode(p.prompt)
    assert '"arguments": {"city": "paris", "days": 2}' in prompt           # an object again, not JSON text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


@pytest.mark.parametrize("extra, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "always"}, "tool_choice"),
    ({"tools": [{"type": "function"}]}, "tools.0"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
])
def test_a_bad_tool_request_is_a_400(server, extra, param):
    with pytest.raises(ApiError) as e:
        prepare_chat(body(**extra), server)
    assert e.value.status == 400 and e.value.param == param and "\n" not in e.value.message


def test_a_template_without_tools_is_refused(llada_dir):
    lm = loading.load(llada_dir, dtype="fp32")
    with pytest.raises(ApiError, match="does not render tools"):
        prepare_chat(dict(body(), model="tiny-llada"), Server(lm, DecodeConfig(gen_len=64), "default", {}))


def test_calls_are_parsed_out_of_the_answer():
    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{bad}\n</tool_call>'
    content, calls = parse_calls(text)
    assert [c["function"] for c in calls] == [{"name": "get_time", "arguments": "{}"}]
    assert content == "Let me check.\n\n<tool_call>\n{bad}\n</tool_call>" and calls[0]["id"].startswith("call_")
    assert parse_calls("no calls here") == ("no calls here", [])


def test_gemma4_calls_are_parsed_out_of_the_answer():
    """Gemma-4's syntax as transformers' response template for gemma4 reads it: call:NAME, bare keys,
    strings between <|"|> (which may hold commas, colons and braces)."""
    q = '<|"|>'
    text = (f'Checking.<|tool_call>call:get_weather{{city:{q}Paris, FR: {{x}}{q},days:2,opts:{{units:[{q}c{q},1]}},'
            f'ok:true}}<tool_call|><|tool_call>call:get_time{{}}<tool_call|><|tool_call>call:broken{{city:{q}x}}<tool_call|>')
    content, calls = parse_calls(text, GEMMA4)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris, FR: {x}", "days": 2,
                                                             "opts": {"units": ["c", 1]}, "ok": True}
    assert calls[1]["function"]["arguments"] == "{}"
    assert content == f"Checking.<|tool_call>call:broken{{city:{q}x}}<tool_call|>"
    assert parse_calls(text, QWEN) == (text, [])                # each syntax parses its own calls only


def test_the_template_names_the_syntax_and_gemma4_takes_auto_only():
    llada21 = (Path(__file__).resolve().parents[1] / "published_configs" / "inclusionAI__LLaDA2.1-mini.chat_template.jinja").read_text()
    gemma = "{%- if tools %}{% for t in tools %}...{% endfor %}{% endif %}{{ '<|tool_call>' }}"   # the markers only
    assert syntax_of(llada21) is QWEN and syntax_of(gemma) is GEMMA4 and syntax_of("{{ messages }}") is None
    assert tools_of(TOOLS, "auto", gemma).syntax is GEMMA4
    with pytest.raises(ApiError, match="needs a grammar for Gemma-4") as e:
        tools_of(TOOLS, "required", gemma)
    assert e.value.status == 400 and e.value.param == "tool_choice"


def test_streamed_calls_come_as_openai_sends_them():
    """Per call: a delta with id, type, name and empty arguments, then one with the arguments; joined
    by index (as the openai client does) they are the whole calls."""
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"days": 2}'}}]
    chunker = Chunker(True, "job", "m", type("P", (), {"include_usage": False})(), 0)
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunker.calls(calls)]
    assert [set(d) for d in deltas] == [{"index", "id", "type", "function"}, {"index", "function"}] * 2
    joined: dict = {}
    for d in deltas:
        seen = joined.setdefault(d["index"], {"id": None, "type": None, "function": {"name": "", "arguments": ""}})
        seen["id"], seen["type"] = d.get("id", seen["id"]), d.get("type", seen["type"])
        for k, v in d["function"].items():
            seen["function"][k] += v
    assert [joined[i] for i in (0, 1)] == calls


@pytest.fixture(scope="module")
def served(dream_dir):
    from serve_process import ServerProcess

    process = ServerProcess("-m", dream_dir, "--dtype", "fp32", "--cache", "prefix")
    yield process
    assert process.stop() == 0, process.log


@pytest.mark.slow
def test_tool_calls_through_the_openai_client(served):
    client = openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=300)
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "get_weather"}}, "get_weather")):
        r = client.chat.completions.create(model="tiny-dream", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=64)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
        call = c.message.tool_calls[0].function
        assert call.name in ("get_weather", "get_time") and (name is None or call.name == name)
        if call.name == "get_weather":
            jsonschema.validate(json.loads(call.arguments), PARAMS)
    print("tool call:", call.name, call.arguments)
    # the result fed back: the next turn renders and answers
    messages = ASK + [c.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": c.message.tool_calls[0].id, "content": "sunny"}]
    r = client.chat.completions.create(model="tiny-dream", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=32)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
    # streamed: the call comes as OpenAI's two tool_calls deltas (name, then arguments), then finish_reason tool_calls
    chunks = list(client.chat.completions.create(model="tiny-dream", messages=ASK, tools=TOOLS, max_tokens=64,
                                                 tool_choice="required", stream=True))
    deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == [0, 0] and deltas[0].id.startswith("call_") and deltas[0].function.name
    assert deltas[0].function.arguments == "" and json.loads(deltas[1].function.arguments) is not None
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.fixture(scope="module")
def llada2_server(tmp_path_factory):
    """A tiny LLaDA2 with LLaDA2.1-mini's published chat template (the tiny vocabulary): its tool syntax is
    Qwen's (`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`) in its own roles."""
    from fastdllm.testing.tiny_moe import write_llada2_moe

    path = write_llada2_moe(tmp_path_factory.mktemp("llada2") / "tiny-llada2")
    published = (Path(__file__).resolve().parents[1] / "published_configs" / "inclusionAI__LLaDA2.1-mini.chat_template.jinja").read_text()
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": published}))
    return Server(loading.load(path, dtype="fp32"), DecodeConfig(gen_len=64, block_len=32), "default", {})


def test_llada2_renders_tools_and_a_required_call_decodes_valid(llada2_server):
    from fastdllm.decode.engine import run

    p = prepare_chat(body(tool_choice="required", model="tiny-llada2"), llada2_server)
    prompt = llada2_server.lm.tokenizer.decode(p.prompt)
    assert "<role>SYSTEM</role># Tools" in prompt and '"name": "get_weather"' in prompt
    result = run(llada2_server.lm.decoder, [p.prompt], p.cfg, constraints=[p.constraint])
    content, calls = parse_calls(llada2_server.lm.detokenize(result.ids[0]))
    assert result.complete[0] and len(calls) == 1, result.texts
    function = calls[0]["function"]
    assert function["name"] in ("get_weather", "get_time")
    schema = PARAMS if function["name"] == "get_weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(json.loads(function["arguments"]), schema)
