"""`fastdllm eval --suite` and `--gen-lens` (cli/eval_rows.py): a suite's rows are bench's, resolved
by bench's code, with the DecodeConfigs they are named for; --gen-lens replaces every request's
max_gen_toks and names the rows ROW@LEN; speed-ups are against the baseline of the same length;
mistakes are one usage line. The CLI tests fake lm-eval's runs (tasks.evaluate_one): only the
rows, their order and the rendering are under test there."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from cli_runner import invoke  # noqa: E402
from helpers import TASKS, one_error  # noqa: E402

from fastdllm.bench import suite as bench_suite  # noqa: E402
from fastdllm.bench.cases import Sweep  # noqa: E402
from fastdllm.bench.prompts import builtin  # noqa: E402
from fastdllm.cli import eval_rows  # noqa: E402
from fastdllm.decode.config import DecodeConfig  # noqa: E402
from fastdllm.eval import tasks  # noqa: E402
from fastdllm.eval.harness import FastdllmLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NO_FLAGS = {f.name: None for f in fields(DecodeConfig)}
PAPER = ["baseline", "parallel", "parallel-factor", "prefix", "dual", "dual+parallel", "dual+factor"]
ROWS = [*PAPER, "fast"]                      # the CLI test's rows at each length: the suite's, then a profile


@pytest.fixture(autouse=True)
def at_root(monkeypatch, one_thread):
    monkeypatch.chdir(ROOT)                  # the tasks' data_files are relative to the root


def settings(model_dir, lm, suite="paper", profiles=None, gen_lens=(32, 64), **flags):
    plan = eval_rows.plan(model_dir, suite, profiles, {**NO_FLAGS, **flags}, gen_lens)
    return plan.settings(lm, chat=False), plan


def test_paper_suite_is_table_1_at_every_length(llada_dir, llada64):
    found, plan = settings(llada_dir, llada64)
    assert [s.name for s in found] == [f"{row}@{g}" for g in (32, 64) for row in PAPER]
    assert plan.left_out == [] and plan.notes == []
    for s in found:
        row, cfg = s.name.split("@")[0], s.cfg
        assert s.gen_len == cfg.gen_len == int(s.name.split("@")[1]) and cfg.block_len == 32
        assert cfg.cache == {"prefix": "prefix", "dual": "dual"}.get(row.split("+")[0], "none")
        rule = "factor" if "factor" in row else "threshold" if "parallel" in row else "fixed"
        assert cfg.rule == rule
        if rule == "fixed":
            assert cfg.total_steps == cfg.gen_len                            # one token a step
        if rule == "threshold":
            assert cfg.threshold == 0.9
        if rule == "factor":
            assert cfg.factor == 1.0


def test_accelerators_suite_is_benchs_own_resolution(llada_dir, llada64):
    found, plan = settings(llada_dir, llada64, suite="accelerators", gen_lens=(32,))
    table, _ = bench_suite.suite_table("accelerators", llada_dir)
    cases, _ = bench_suite.expand_kept(list(table.values()), Sweep(gen_len=(32,)), llada_dir)
    kept, _ = bench_suite.applicable(llada64, cases, builtin("math").take(1), False)
    assert [(s.name, s.cfg) for s in found] == [(f"{c.name}@32", c.cfg) for c in kept]
    assert found[0].name == "baseline@32"
    assert "dkv at gen_len 32: gen_len 32 is not a multiple of block_len 64" in plan.left_out     # blocks of 64


def test_decoding_flags_fill_what_a_row_leaves_open(llada_dir, llada64):
    found, plan = settings(llada_dir, llada64, gen_lens=None, threshold=0.8, cache="dual", confidence="margin",
                           profiles=["baseline", "fast"])
    by = {s.name: s.cfg for s in found}
    assert list(by) == [*PAPER, "profile:baseline", "fast"]            # suite rows, then the profiles
    assert by["parallel"].threshold == 0.8 and by["parallel"].cache == "none"       # bench's sweep flag; own cache
    assert {c.confidence for c in by.values()} == {"margin"}
    assert by["profile:baseline"].cache == "dual"                      # a profile: the flags on top, as before
    assert plan.notes == ["--cache does not change the rows that set it: " + ", ".join(PAPER)]
    assert {s.gen_len for s in found} == {None}                        # the tasks' own max_gen_toks


def request(context: str, max_gen_toks: int, i: int) -> Instance:
    return Instance(request_type="generate_until", doc={}, idx=i,
                    arguments=(context, {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False}))


def test_gen_len_replaces_the_requests_max_gen_toks(llada64):
    cfg = DecodeConfig(gen_len=8, block_len=8, cache="dual", threshold=0.7)
    contexts = ["def add(a, b):", "x = 1\ny ="]
    replaced = FastdllmLM(lm=llada64, cfg=cfg, max_gen_toks=16)
    asked = FastdllmLM(lm=llada64, cfg=cfg)
    got = replaced.generate_until([request(c, 8, i) for i, c in enumerate(contexts)])
    want = asked.generate_until([request(c, 16, i) for i, c in enumerate(contexts)])
    assert got == want and vars(replaced.stats) | {"seconds": 0} == vars(asked.stats) | {"seconds": 0}


def record(task: str, name: str, gen_len: int | None, tps: float) -> dict:
    return {"task": task, "profile": name, "gen_len": gen_len, "tokens_per_second": tps, "value": 0.5, "change": None}


def test_speed_up_is_against_the_baseline_of_the_same_length():
    records = tasks.compare([record("a", "baseline@256", 256, 10.0), record("a", "dual@256", 256, 30.0),
                             record("a", "baseline@512", 512, 4.0), record("a", "dual@512", 512, 20.0),
                             record("b", "baseline@256", 256, 5.0), record("b", "dual@256", 256, 10.0)])
    assert [r["change"] and (r["change"]["profile"], r["change"]["speed"]) for r in records] == [
        None, ("baseline@256", 3.0), None, ("baseline@512", 5.0), None, ("baseline@256", 2.0)]


def fake_evaluate_one(ran: list):
    """tasks.evaluate_one without lm-eval: a record whose tokens/s is 10 x the row's place at its length."""
    def evaluate_one(lm, task, profile, cfg, manager, options, progress=None, world=None, gen_len=None):
        ran.append((profile, cfg, gen_len))
        return {"task": task, "profile": profile, "gen_len": gen_len, "metric": "exact_match,none", "value": 0.25,
                "stderr": 0.1, "change": None, "tokens_per_second": 10.0 * (1 + ROWS.index(profile.split("@")[0])),
                "nfe_per_answer": 4.0, "tokens_per_forward": 2.0, "answers": 2, "seconds": 1.0, "config": cfg.to_dict(),
                "limit": 2, "num_fewshot": None, "chat": False, "model": str(lm.path), "family": "llada",
                "device": "cpu", "dtype": "float32", "quantize": "none", "machine": "test", "torch": "t",
                "cuda": None, "lm_eval": "l", "fastdllm": "f", "processes": 1}
    return evaluate_one


def test_one_command_gives_the_markdown_table(llada_dir, monkeypatch):
    ran = []
    monkeypatch.setattr(tasks, "evaluate_one", fake_evaluate_one(ran))
    r = invoke("eval", "-m", llada_dir, "--include-path", TASKS, "--tasks", "tiny_next_line", "--suite", "paper",
               "--profiles", "fast", "--gen-lens", "32,64", "--limit", "2", "--format", "md")
    assert r.exit_code == 0, r.stderr
    assert [(name, cfg.gen_len, g) for name, cfg, g in ran] == [
        (f"{row}@{g}", g, g) for g in (32, 64) for row in ROWS]
    lines = r.stdout.splitlines()
    header, rows = lines[0], lines[2:18]
    assert header.startswith("| task | profile |") and lines[18] == ""         # the table, then its caption
    assert all(line.startswith("| ") and line.count("|") == header.count("|") for line in rows)
    cells = {line.split(" | ")[1]: line.split(" | ") for line in rows}
    column = header.split(" | ").index
    assert cells["baseline@64"][column("speed")] == "" and cells["dual+parallel@64"][column("speed")] == "6.00x"
    assert cells["fast@32"][column("speed")] == "8.00x" and cells["parallel-factor@32"][column("rule")] == "f=1"
    assert "at the same gen_len" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--suite", "table1"], "unknown suite 'table1' (available: paper, accelerators)"),
    (["--gen-lens", "0"], "--gen-lens 0: expected answer lengths"),
    (["--gen-lens", "256,many"], "--gen-lens 256,many: expected answer lengths"),
    (["--suite", "paper", "--gen-lens", "48"], "gen_len 48 is not a multiple of block_len 32"),
    (["--gen-lens", "64", "--gen-len", "64"], "not both"),
])
def test_mistakes_are_one_usage_line(llada_dir, args, words):
    r = invoke("eval", "-m", llada_dir, "--include-path", TASKS, "--tasks", "tiny_next_line", "--limit", "1", *args)
    assert r.exit_code == 2 and one_error(r.stderr, words), r.stderr
