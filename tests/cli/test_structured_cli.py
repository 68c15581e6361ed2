"""`generate` and `chat` with --json-schema, --regex, --grammar on the built-in model: the answer
validates; a bad constraint or two at once exits 2 with one line; a length cut says so (the slow lane
runs the regex, grammar and length cases, which the engine's tests cover in the fast lane)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from cli_runner import invoke  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}
FAST = ("-n", "32", "--cache", "prefix")


def test_generate_answers_valid_json_under_a_schema(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    r = invoke("generate", *FAST, "--raw", "--json-schema", path, "--json", "def add(a, b):")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    jsonschema.validate(json.loads(record["text"]), SCHEMA)
    assert record["complete"] is True and record["finish_reason"] == "stop" and record["matcher_s"] > 0


@pytest.mark.slow
def test_generate_and_chat_answer_a_regex_and_a_grammar(tmp_path):
    grammar = tmp_path / "yes.lark"
    grammar.write_text('start: ("yes" | "no") " " NUMBER\nNUMBER: /[1-9][0-9]?/\n')
    r = invoke("generate", *FAST, "--raw", "--grammar", grammar, "def add(a, b):")
    assert r.exit_code == 0, r.stderr
    assert re.fullmatch(r"(yes|no) [1-9][0-9]?\n", r.stdout), r.stdout
    r = invoke("chat", *FAST, "--regex", r"[a-z]{2,6}(, [a-z]{2,6})?", input="Hello\n/bye\n")
    assert r.exit_code == 0, r.stderr
    assert re.fullmatch(r"[a-z]{2,6}(, [a-z]{2,6})?\n", r.stdout), r.stdout


@pytest.mark.parametrize("args, message", [
    (("--regex", "a("), "regex: invalid regex"),
    (("--regex", "a", "--regex", "b"), None),                    # the last one wins, as for any flag
    (("--regex", "a", "--grammar", "g.lark"), "give one of them"),
    (("--json-schema", "missing.json"), "cannot read it"),
])
def test_a_bad_constraint_exits_2_with_one_line(args, message):
    r = invoke("generate", *FAST, *args, "x")
    if message is None:
        assert r.exit_code == 0, r.stderr
        return
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


@pytest.mark.slow
def test_an_answer_cut_by_its_length_says_so(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"type": "string", "minLength": 300}))
    r = invoke("generate", *FAST, "--json-schema", path, "--json", "x")
    assert r.exit_code == 0 and "finish: length" in r.stderr, r.stderr
    record = json.loads(r.stdout)
    assert record["finish_reason"] == "length" and record["complete"] is False and record["text"].startswith('"')
