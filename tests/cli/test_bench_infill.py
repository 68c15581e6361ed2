"""fastdllm bench on infilling prompt sets (the `infill` set, suffix files, refusals); the rest of
bench: tests/cli/test_bench.py."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from fastdllm.bench import prompts
from fastdllm.bench import runner as bench
from fastdllm.bench.cases import Sweep, expand, pick_rows
from fastdllm.bench.runner import agreement, compare
from fastdllm.cli.app import app
from fastdllm.errors import UsageError, UserError

NO_ENV: dict = {}                     # isolate expansion from FASTDLLM_* variables of the shell
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["bench", *map(str, args)], catch_exceptions=False)


# --- infilling -----------------------------------------------------------------------------------

def infill_templates(lm, prompt_set, gen_len):
    """The set's templates as `fastdllm generate --suffix` builds them (cli/infill.py)."""
    from fastdllm.decode import infill

    encode = lambda text: lm.tokenizer(text, add_special_tokens=False)["input_ids"]    # noqa: E731
    return [infill.tokenize([p, None, s], encode, mask=lm.specials.mask, default_len=gen_len)
            for p, s in zip(prompt_set.prompts, prompt_set.suffixes)]


def test_infill_set_is_sixteen_return_lines_after_parsing_middles():
    import ast

    s = prompts.builtin("infill")
    assert len(s.prompts) == len(s.references) == len(s.suffixes) == 16 and s.quality_metric == "parses"
    for prefix, middle, suffix in zip(s.prompts, s.references, s.suffixes):
        ast.parse(prefix + middle + suffix)
        assert prefix.startswith("def ") and 1 <= middle.count("\n") <= 8
        assert suffix.lstrip().startswith("return ") and suffix.count("\n") == 1 and suffix.endswith("\n")
    assert s.quality(s.references) == 1.0                       # judged with the suffix after the answer
    assert s.quality(["    if x:\n"] + s.references[1:]) == 15 / 16
    two = s.take(2)
    assert two.suffixes == s.suffixes[:2] and two.references == s.references[:2]
    assert prompts.builtin("infill") is s                       # cut once


def test_infill_set_reads_the_stdlib_only_when_asked_for():
    import subprocess

    code = "import sys, fastdllm.bench.prompts; print('fastdllm.training.data' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_prompts_file_with_suffixes_is_an_infilling_set(tmp_path):
    (tmp_path / "f.jsonl").write_text('{"prompt": "def f(x):\\n", "suffix": "    return y\\n"}\n\n'
                                      '{"prompt": "a = ", "suffix": "\\n"}\n')
    s = prompts.from_file(tmp_path / "f.jsonl")
    assert s.prompts == ["def f(x):\n", "a = "] and s.suffixes == ["    return y\n", "\n"] and s.check is None
    (tmp_path / "mix.jsonl").write_text('{"prompt": "a", "suffix": "b"}\n\n{"prompt": "c"}\n')
    with pytest.raises(UsageError, match=r'mix.jsonl:3: no "suffix", unlike line 1') as e:
        prompts.from_file(tmp_path / "mix.jsonl")
    assert "\n" not in str(e.value)
    (tmp_path / "mix2.jsonl").write_text('{"prompt": "a"}\n{"prompt": "c", "suffix": "d"}\n')
    with pytest.raises(UsageError, match=r'mix2.jsonl:2: a "suffix", unlike line 1'):
        prompts.from_file(tmp_path / "mix2.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "suffix": 3}\n')
    with pytest.raises(UsageError, match=r'bad.jsonl:1: "suffix" must be a non-empty string'):
        prompts.from_file(tmp_path / "bad.jsonl")


def test_runner_infill_rows_equal_each_template_run_alone(llada64, one_thread):
    from fastdllm.decode.engine import run

    chosen = prompts.builtin("infill").take(2)
    cases = expand(pick_rows(["baseline", "dual+parallel"]), Sweep(gen_len=(16,), block_len=(8,)), environ=NO_ENV)
    measured = list(bench.measure(llada64, cases, chosen, warmup=1))
    records = compare(measured)
    fills = infill_templates(llada64, chosen, 16)
    for case, m in zip(cases, measured):
        alone = [run(llada64.decoder, [f.ids], case.cfg, holes=f.holes) for f in fills]
        assert m.answers == [r.ids[0] for r in alone]
        assert m.record["nfe"] == sum(r.nfe for r in alone)
        assert m.record["generated_tokens"] == sum(len(r.ids[0]) for r in alone)
        assert m.record["quality"] == chosen.quality([r.texts[0] for r in alone])
        assert m.record["infill"] is True and m.record["chat_template"] is False and m.record["n_prompts"] == 2
    tokens, answers = agreement(measured[1].answers, measured[0].answers)
    assert records[1]["agreement_tokens"] == round(tokens, 4) and records[1]["agreement_answers"] == round(answers, 4)
    assert records[0]["agreement_tokens"] == 1.0


def test_cli_bench_infill_set(llada_dir):
    r = invoke("-m", llada_dir, "--prompt-set", "infill", "--n-prompts", "2", "-n", "16", "--block-len", "8",
               "-c", "baseline,dual", "-o", "jsonl")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["config"] for x in rows] == ["baseline", "dual"]
    for x in rows:
        assert x["prompt_set"] == "infill" and x["infill"] is True and x["quality_metric"] == "parses"
        assert 0.0 <= x["quality"] <= 1.0 and x["nfe"] > 0 and x["generated_tokens"] >= 0
        assert x["agreement_tokens"] is not None


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "1,2"], "--batch-size: infilling prompts run one at a time"),
    (["--chat"], "--chat: infilling prompts are raw text"),
])
def test_cli_infill_refusals_are_one_line_before_loading(llada_dir, monkeypatch, args, message):
    import fastdllm.cli.bench as cli_bench

    monkeypatch.setattr(cli_bench, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    r = invoke("-m", llada_dir, "--prompt-set", "infill", "-n", "16", "--block-len", "8", *args)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_block_causal_model_refuses_the_infill_set_before_any_row(tiny, monkeypatch):
    from fastdllm.checkpoints import loading

    path = tiny("sdar")
    lm = loading.load(path, dtype="fp32")
    cases = expand(pick_rows(["baseline"]), Sweep(gen_len=(16,), block_len=(4,)), path, environ=NO_ENV)
    from fastdllm.bench import clock

    monkeypatch.setattr(clock, "run", lambda *a, **k: pytest.fail("a row ran"))
    with pytest.raises(UserError, match="tiny-sdar cannot fill holes"):
        list(bench.measure(lm, cases, prompts.builtin("infill").take(2)))


def test_an_infilled_answer_between_whole_lines_is_judged_as_whole_lines():
    from fastdllm.bench.prompts import in_place

    assert in_place("def f(x):\n", "    y = x  ", "    return y\n") == "    y = x\n    return y\n"
    assert in_place("def f(x):\n", "    y = x\n", "    return y\n") == "    y = x\n    return y\n"
    assert in_place("x = (", "1 ", ")\n") == "1 )\n"                  # inside a line: as it is
