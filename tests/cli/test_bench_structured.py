"""`fastdllm bench --json-schema / --regex / --grammar`: every row beside its twin decoding under
the constraint (ROW+KIND); the twin's answers are the engine's constrained answers, each complete
one valid; rows that cannot honour a constraint are left out by name; bad input is one line."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from cli_runner import invoke  # noqa: E402

from fastdllm.bench import prompts  # noqa: E402
from fastdllm.bench import runner as bench  # noqa: E402
from fastdllm.bench.cases import Sweep, expand, pick_rows, with_constraint  # noqa: E402
from fastdllm.decode.constraint import Compiled, Spec  # noqa: E402
from fastdllm.decode.profiles import find  # noqa: E402
from fastdllm.decode.engine import run  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"],
          "additionalProperties": False}
NO_ENV: dict = {}


def test_the_twin_row_decodes_what_the_engine_decodes_under_the_schema(llada64):
    cases, left_out = with_constraint(expand(pick_rows(["prefix+parallel"]), Sweep(gen_len=(32,)), environ=NO_ENV),
                                      "json_schema")
    assert [c.name for c in cases] == ["prefix+parallel", "prefix+parallel+json_schema"] and left_out == []
    compiled = Compiled(Spec("json_schema", json.dumps(SCHEMA)), llada64.tokenizer)
    chosen = prompts.PromptSet("t", ["def f(x):\n", "Hello there"])
    free, constrained = bench.measure(llada64, cases, chosen, chat=False, warmup=0, repetitions=1,
                                      constraint=compiled)
    assert free.record["constraint"] is None and free.record["matcher_ms_per_step"] is None
    assert constrained.record["constraint"] == "json_schema" and constrained.record["matcher_ms_per_step"] > 0
    done = 0
    for prompt, answer in zip(chosen.prompts, constrained.answers):
        alone = run(llada64.decoder, [llada64.encode(prompt, chat=False)], cases[1].cfg, constraints=[compiled])
        assert alone.ids[0] == answer
        if alone.complete[0]:
            jsonschema.validate(json.loads(alone.texts[0]), SCHEMA)
            done += 1
    assert constrained.record["constraint_complete"] == [done, 2]
    assert free.answers != constrained.answers                   # the twin really decoded under the schema


def test_cli_rows_and_their_twins(tmp_path):
    out = tmp_path / "r.json"
    r = invoke("bench", "-n", "64", "-c", "prefix+parallel", "-P", "dkv", "--n-prompts", "1", "--raw", "-r", "1",
               "--warmup", "0", "--regex", "[a-z]{1,5}", "--output", out)
    assert r.exit_code == 0, r.stderr
    records = json.loads(out.read_text())["records"]
    assert [x["config"] for x in records] == ["prefix+parallel", "prefix+parallel+regex", "dkv", "dkv+regex"]
    assert [x["constraint"] for x in records] == [None, "regex", None, "regex"]
    assert "complete" in r.stdout and "matcher ms/step" in r.stdout


def test_a_row_that_cannot_take_a_constraint_is_left_out_by_name():
    cases = expand(pick_rows(["dual+parallel"], []), Sweep(gen_len=(256,)), environ=NO_ENV)
    cases += expand(pick_rows([], [find("prophet")]), Sweep(gen_len=(256,)), environ=NO_ENV)
    kept, left_out = with_constraint(cases, "regex")
    assert [c.name for c in kept] == ["dual+parallel", "dual+parallel+regex", "prophet"]
    assert len(left_out) == 1 and left_out[0].startswith("prophet+regex: structured output: not combined with prophet")


@pytest.mark.parametrize("args, message", [
    (("--regex", "a("), "regex: invalid regex"),
    (("--regex", "a", "--grammar", "g.lark"), "give one of them"),
    (("--regex", "a", "--prompt-set", "infill"), "not combined with infilling"),
])
def test_a_bad_constraint_exits_2_with_one_line(args, message):
    r = invoke("bench", "-n", "32", "-c", "prefix+parallel", "--n-prompts", "1", "-r", "1", "--warmup", "0", *args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
