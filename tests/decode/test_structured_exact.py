"""Structured output is what it says (issue 51: 1), against the app in this process (Starlette's
TestClient, the real scheduler, a tiny Fast-dLLM v2 with its chat template and Qwen's tokenizer):

- every answer whose finish_reason is "stop" validates under an independent validator (jsonschema,
  whose integers are exact: bounds beyond 2^53 included), on the chat and the completions endpoint;
- what the matcher would not hold as written (an integer a double rounds, a number beyond 64 bits,
  a non-finite one, nesting thousands deep) is a 400 naming the field before decoding, never a 500;
- a matcher that fails mid-answer is its own error (HTTP 400, code constraint_failed; "error" in
  the engine's result; one line and exit 1 in the CLI), never finish_reason "length";
- every endpoint honours each structured field it is sent or refuses it by name."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")

from fastapi.testclient import TestClient  # noqa: E402

from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.decode import profiles  # noqa: E402

BIG = 2 ** 53 + 1                                   # 9007199254740993: no double holds it
SCHEMAS = {                                         # every common shape; each answer fits 64 tokens or says length
    "beyond 2^53": {"type": "object", "required": ["n"], "additionalProperties": False,
                    "properties": {"n": {"type": "integer", "minimum": 2 ** 60, "maximum": 2 ** 60 + 256}}},
    "just past 2^53": {"type": "integer", "minimum": 2 ** 53 + 2, "maximum": 2 ** 53 + 10},
    "negative": {"type": "integer", "minimum": -2 ** 62 - 1024, "maximum": -2 ** 62},
    "i64 edges": {"type": "array", "items": {"type": "integer", "minimum": -2 ** 63 + 1024, "maximum": 2 ** 63 - 1024},
                  "minItems": 2, "maxItems": 2},
    "ab": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}, "required": ["a", "b"],
           "additionalProperties": False},
    "nested": {"type": "object", "additionalProperties": False, "required": ["p"], "properties": {"p": {
        "type": "object", "additionalProperties": False, "required": ["name", "tags"], "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}}}}},
    "enum and const": {"type": "array", "prefixItems": [{"enum": [1, "two", None, 3.5]}, {"const": 2 ** 60}],
                       "items": False, "minItems": 2},
    "number bounds": {"type": "number", "minimum": -1.5, "maximum": 2.5},
    "any of": {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 20}, {"type": "string", "maxLength": 4}]},
    "nullable": {"type": ["string", "null"], "maxLength": 5},
}
PROMPTS = ["def person():", "Give the answer as JSON."]


@pytest.fixture(scope="module")
def v2(tiny):
    path = tiny("fast_dllm_v2")
    return path, loading.load(path, dtype="fp32")


@pytest.fixture(scope="module")
def app(v2):
    from fastdllm.serve.app import create_app
    from fastdllm.serve.metrics import Metrics
    from fastdllm.serve.scheduler import Scheduler

    path, lm = v2
    profile = profiles.find(profiles.default_profile_for(path))
    scheduler = Scheduler(lm.decoder)
    scheduler.start()
    yield TestClient(create_app(lm, scheduler, base_cfg=profiles.resolve(profile, {}, path), profile_name=profile.name,
                                cli_flags={}, api_key=None, metrics=Metrics(), name="tiny-v2"))
    scheduler.shutdown(10)


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}


def chat(app, content: str = PROMPTS[0], **fields):
    return app.post("/v1/chat/completions", json={"model": "tiny-v2", "max_tokens": 64,
                                                  "messages": [{"role": "user", "content": content}], **fields})


def complete(app, prompt: str = PROMPTS[0], **fields):
    return app.post("/v1/completions", json={"model": "tiny-v2", "max_tokens": 64, "prompt": prompt, **fields})


def refused(r, param: str | None, *words: str) -> dict:
    assert r.status_code == 400, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    assert all(w in error["message"] for w in words), error
    return error


def test_every_stop_answer_validates_independently(app, one_thread):
    stops = 0
    for name, schema in SCHEMAS.items():
        for prompt in PROMPTS:
            for r in (chat(app, prompt, response_format=schema_format(schema)),
                      complete(app, prompt, response_format=schema_format(schema))):
                assert r.status_code == 200, (name, r.text)
                choice = r.json()["choices"][0]
                text = choice["message"]["content"] if "message" in choice else choice["text"]
                assert choice["finish_reason"] in ("stop", "length"), (name, choice)
                if choice["finish_reason"] == "stop":
                    stops += 1
                    jsonschema.validate(json.loads(text), schema)       # Python's ints: exact at any size
    print(f"{stops} of {len(SCHEMAS) * len(PROMPTS) * 2} answers whole, each valid")
    assert stops >= len(SCHEMAS) * len(PROMPTS)


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": BIG, "maximum": BIG + 6}}},
     (str(BIG), "at properties.n.minimum", "doubles")),
    ({"const": BIG}, (str(BIG), "at const")),
    ({"enum": [1, 2 ** 70]}, ("1180591620717411303424", "at enum.1")),
    ({"type": "integer", "maximum": 1e20}, ("1e+20", "at maximum", "64-bit")),
    ({"type": "integer", "minimum": 2 ** 63}, ("9223372036854775808",)),
    ({"type": "integer", "default": -(10 ** 40)}, ("-1000000000000000000... (41 digits)",)),
])
def test_numbers_the_matcher_would_not_hold_are_a_400_before_decoding(app, schema, words):
    refused(chat(app, response_format=schema_format(schema)), "response_format.json_schema.schema", *words)
    refused(complete(app, response_format=schema_format(schema)), "response_format.json_schema.schema", *words)
    r = app.post("/api/chat", json={"model": "tiny-v2", "stream": False, "format": schema,
                                    "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"].startswith("format: JSON Schema: "), r.text


def test_tool_parameters_the_matcher_would_not_hold_are_refused(app):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": BIG}}}}}]
    refused(chat(app, tools=tools, tool_choice="required"), "tools.0.function.parameters", str(BIG))


def raw(app, path: str, text: str):
    return app.post(path, content=text.encode(), headers={"content-type": "application/json"})


def test_bodies_that_do_not_read_as_numbers_or_nest_too_deep_are_400s(app):
    head = '{"model": "tiny-v2", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], '
    schema = lambda s: (head + '"response_format": {"type": "json_schema", "json_schema": {"name": "s", '  # noqa: E731
                        '"schema": ' + s + "}}}")
    refused(raw(app, "/v1/chat/completions", schema('{"type": "number", "maximum": 1e400}')),
            "response_format.json_schema.schema", "inf", "not a finite number")
    r = raw(app, "/v1/chat/completions", schema('{"type": "integer", "maximum": ' + "9" * 5000 + "}"))
    refused(r, None, "the request body is not read")
    for depth, words in ((150, ("nested more than 100 levels deep",)), (5000, ("nests too deeply",))):
        nested = '{"type": "array", "items": ' * depth + '{"type": "integer"}' + "}" * depth
        r = raw(app, "/v1/chat/completions", schema(nested))
        refused(r, "response_format.json_schema.schema" if depth < 1000 else None, *words)
    r = raw(app, "/api/generate", '{"model": "tiny-v2", "prompt": "x", "format": ' + "[" * 5000 + "]" * 5000 + "}")
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"], r.text


FAILS = r"(x|y)(a{1000}){1000}"        # the library's lexer gives up once the a's begin: mid-answer


def test_a_matcher_failure_mid_answer_is_its_own_error(app, one_thread):
    for r in (complete(app, fastdllm={"regex": FAILS}), chat(app, fastdllm={"regex": FAILS})):
        error = refused(r, None, "grammar matcher failed after", "too many expressions")
        assert error["code"] == "constraint_failed"
    r = complete(app, fastdllm={"regex": FAILS}, stream=True)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == "constraint_failed", events[-1]
    assert not any(c.get("finish_reason") for e in events for c in e.get("choices", ()))     # never "length"


def test_the_engine_and_the_cli_say_error_where_the_matcher_failed(v2, one_thread):
    from cli_runner import invoke

    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.constraint import Compiled, Spec
    from fastdllm.decode.engine import run

    path, lm = v2
    r = run(lm.decoder, [lm.encode("Hi.", chat=True)], DecodeConfig(gen_len=32, block_len=32),
            constraints=[Compiled(Spec("regex", FAILS), lm.tokenizer)])
    assert r.finish_reasons == ["error"] and r.complete == [False], r.texts
    assert "too many expressions" in r.constraint_errors[0] and r.to_dict()["constraint_error"]
    out = invoke("generate", "-m", path, "--dtype", "fp32", "-n", 32, "--regex", FAILS, "Hi.")
    assert out.exit_code == 1 and "grammar matcher failed after" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("fields, param", [
    ({"fastdllm": {"regex": "^(a{1000}){1000}$"}}, "fastdllm.regex"),        # forced a's: refused as compiled
    ({"response_format": schema_format({"type": "object", "required": ["p999"],
                                        "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}})},
     "response_format.json_schema.schema"),
])
def test_a_matcher_that_fails_on_the_forced_start_is_refused_before_decoding(app, fields, param):
    refused(chat(app, **fields), param, "the matcher fails on the answer's first tokens")


def test_completions_honour_response_format(app, one_thread):
    schema = SCHEMAS["ab"]
    r = complete(app, response_format=schema_format(schema))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice         # was: free text, the field ignored
    jsonschema.validate(json.loads(choice["text"]), schema)
    r = complete(app, response_format={"type": "json_object"}, max_tokens=128)
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(r.json()["choices"][0]["text"]), dict)
    else:
        assert r.json()["choices"][0]["text"].startswith("{")
    refused(complete(app, response_format={"type": "yaml"}), "response_format.type")


@pytest.mark.parametrize("endpoint, fields, param, words", [
    ("chat", {"guided_json": {"type": "object"}}, "guided_json", ("send response_format json_schema",)),
    ("completions", {"guided_regex": "[a-z]+"}, "guided_regex", ("send fastdllm.regex",)),
    ("completions", {"guided_choice": ["a", "b"]}, "guided_choice", ()),
    ("chat", {"guided_grammar": "start: x"}, "guided_grammar", ()),
    ("chat", {"structured_outputs": {"json": {}}}, "structured_outputs", ()),
    ("chat", {"functions": [{"name": "f"}]}, "functions", ("send tools",)),
    ("chat", {"function_call": "auto"}, "function_call", ("send tool_choice",)),
    ("completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", ("/v1/chat/completions",)),
    ("completions", {"tool_choice": "required"}, "tool_choice", ()),
    ("completions", {"functions": [{"name": "f"}]}, "functions", ("send tools to /v1/chat/completions",)),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": False},
     "parallel_tool_calls", ("'required' or a named function",)),
])
def test_structured_fields_an_endpoint_does_not_take_are_refused_by_name(app, endpoint, fields, param, words):
    refused((chat if endpoint == "chat" else complete)(app, **fields), param, f"{param}: ", *words)


def test_an_id_past_the_tokenizer_right_of_the_frontier_is_cut_not_a_failure(v2):
    """A head wider than the tokenizer (Qwen's 152,064 rows, 151,666 tokens) may put a padding id right
    of the frontier; handed to the library it puts the matcher in error ("token id out of range"),
    which ended such answers early. The run is cut before it instead; the matcher goes on."""
    import torch

    from fastdllm.decode.constraint import Compiled, RowConstraints, Spec

    _, lm = v2
    string = Compiled(Spec("json_schema", json.dumps({"type": "string", "maxLength": 20})), lm.tokenizer)
    good = lm.tokenizer.encode('"ab', add_special_tokens=False)
    padding = string.tokenizer.vocab_size + 5
    rows = RowConstraints([string], lm.specials.stops)
    K = len(good) + 2
    tokens = torch.tensor([good + [padding] + good[:1]])
    _, chosen = rows.decide(tokens, torch.ones(1, K, dtype=torch.bool), torch.ones(1, K, dtype=torch.bool))
    assert chosen[0].tolist() == [True] * len(good) + [False, False]
    assert rows.errors == [None] and not rows.matchers[0].is_error()
