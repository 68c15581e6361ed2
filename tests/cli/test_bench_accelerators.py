"""`fastdllm bench --suite accelerators` (fastdllm/bench/suite.py, docs/accelerators/bench.md 8): the rows
are the methods' profiles, refused rows are left out with the method's own line, agreement and
the machine formats carry the new rows. Tiny models, short answers, one repetition."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from fastdllm.bench import prompts
from fastdllm.bench import runner as bench
from fastdllm.bench.cases import CONFIGS, Row, Sweep, pick_rows
from fastdllm.bench.suite import ACCELERATORS, applicable, expand_kept, suite_table
from fastdllm.cli.app import app
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.profiles import find
from fastdllm.decode.rules import describe
from fastdllm.errors import UsageError

NO_ENV: dict = {}


def suite_cases(model_dir, gen_len):
    table, left_out = suite_table("accelerators", model_dir)
    assert left_out == []
    return expand_kept(pick_rows(None, (), table), Sweep(gen_len=(gen_len,)), model_dir, NO_ENV)


def test_rows_are_the_methods_profiles(llada_dir):
    cases, left_out = suite_cases(llada_dir, 256)
    assert left_out == [] and [c.name for c in cases] == [name for name, *_ in ACCELERATORS]
    by = {c.name: c.cfg for c in cases}
    for name, profile, overrides, _ in ACCELERATORS:
        if profile is None:                       # Fast-dLLM's rows: the bench's own
            assert by[name].cache == CONFIGS[name].values["cache"]
            continue
        for key, value in {**find(profile).values, **DecodeConfig.parse(overrides)}.items():
            if key != "gen_len":                  # the sweep's
                assert getattr(by[name], key) == value, (name, key)
    shape = {name: (cfg.cache, cfg.rule, cfg.block_len, bool(cfg.credit), bool(cfg.prophet), cfg.dpad_window)
             for name, cfg in by.items()}
    assert shape == {
        "baseline": ("none", "fixed", 32, False, False, None),
        "dual+parallel": ("dual", "threshold", 32, False, False, None),
        "dual+factor": ("dual", "factor", 32, False, False, None),
        "dus": ("none", "dilated", 32, False, False, None),
        "dual+dus": ("dual", "dilated", 32, False, False, None),
        "credit": ("none", "dinfer", 64, True, False, None),
        "dual+dinfer": ("dual", "dinfer", 64, False, False, None),
        "dual+credit": ("dual", "dinfer", 64, True, False, None),
        "dual+parallel+credit": ("dual", "threshold", 32, True, False, None),
        "prophet": ("none", "fixed", 32, False, True, None),
        "dual+parallel+prophet": ("dual", "threshold", 32, False, True, None),
        "dpad": ("none", "fixed", 32, False, False, 256),
        "prefix+parallel+dpad": ("prefix", "threshold", 32, False, False, 256),
        "dual+parallel+dpad": ("dual", "threshold", 32, False, False, 256),
        "dkv": ("dkv", "fixed", 64, False, False, None),
        "dkv+parallel": ("dkv", "threshold", 64, False, False, None),
        "dllm-cache": ("dllm_cache", "fixed", 8, False, False, None),
        "dllm-cache+parallel": ("dllm_cache", "threshold", 8, False, False, None),
        "local-leap": ("none", "local_leap", 32, False, False, None),
        "dual+local-leap": ("dual", "local_leap", 32, False, False, None),
        "prefix+frechet": ("prefix", "frechet", 32, False, False, None),
        "dual+frechet": ("dual", "frechet", 32, False, False, None),
        "klass": ("none", "klass", 64, False, False, None),
        "dual+klass": ("dual", "klass", 64, False, False, None),
    }
    assert by["dpad"].total_steps == by["prophet"].total_steps == 256          # one token a step
    assert {c.group for c in cases} == {(256, None, 1)}                         # one baseline for all
    assert describe(by["dual+credit"]) == "dinfer threshold 0.8 + credit"       # the live view's header
    assert describe(by["prefix+parallel+dpad"]).endswith("+ dpad 256")


def test_a_row_the_sweep_refuses_is_left_out_with_its_line(llada_dir):
    cases, left_out = suite_cases(llada_dir, 64)
    assert "prophet" not in {c.name for c in cases} and len(cases) == len(ACCELERATORS) - 2
    assert left_out == [f"{row} at gen_len 64: answer_anchor: offset 202 leaves no answer region inside gen_len 64 "
                        "(it starts two slots after the last anchor)" for row in ("prophet", "dual+parallel+prophet")]
    with pytest.raises(UsageError, match="unknown suite 'fast'"):
        suite_table("fast")


def test_block_causal_model_leaves_out_what_the_engine_refuses(tiny):
    from fastdllm.checkpoints import loading

    path = tiny("sdar")
    cases, _ = suite_cases(path, 64)
    assert "sdar" in {c.name for c in cases}                                  # the family's own profile
    assert {c.cfg.block_len for c in cases} == {4}                              # the family's block everywhere
    lm = loading.load(path, dtype="fp32")
    kept, left_out = applicable(lm, cases, prompts.builtin("code").take(1), False)
    assert [c.name for c in kept] == ["baseline", "dual+parallel", "dual+factor", "sdar", "dus", "dual+dus",
                                      "credit", "dual+dinfer", "dual+credit", "dual+parallel+credit",
                                      "local-leap", "dual+local-leap", "prefix+frechet", "dual+frechet"]
    dpad = "dpad drops attention to the masked suffix; tiny-sdar attends block-causally and never sees it"
    dkv = ("cache dkv delays caching of decoded tokens under bidirectional attention; tiny-sdar's finished "
           "blocks are already final (use prefix)")
    feature = "cache dllm_cache: built for LLaDA and Dream only (their blocks host the feature cache); tiny-sdar is refused"
    klass = ("rule klass: tiny-sdar is block-causal; KLASS is built for bidirectional models (LLaDA, Dream), "
             "whose every step may read the next block")
    assert left_out == [f"{r}: {dpad}" for r in ("dpad", "prefix+parallel+dpad", "dual+parallel+dpad")] + [
        f"{r}: {dkv}" for r in ("dkv", "dkv+parallel")] + [
        f"{r}: {feature}" for r in ("dllm-cache", "dllm-cache+parallel")] + [f"{r}: {klass}" for r in ("klass", "dual+klass")]


def test_agreement_is_computed_and_an_identical_config_agrees_fully(llada64, one_thread):
    table, _ = suite_table("accelerators")
    rows = [table[n] for n in ("baseline", "dus", "dual+credit")] + [Row("again", CONFIGS["baseline"].values)]
    cases, _ = expand_kept(rows, Sweep(gen_len=(64,)), None, NO_ENV)
    chosen = prompts.PromptSet("t", ["def f(x):\n", "Hello there"])
    records = bench.compare(list(bench.measure(llada64, cases, chosen, chat=False, warmup=0, repetitions=1)))
    by = {r["config"]: r for r in records}
    assert by["again"]["agreement_tokens"] == by["again"]["agreement_answers"] == 1.0
    assert all(0.0 <= r["agreement_tokens"] <= 1.0 and r["speedup"] is not None for r in records)
    assert by["dual+credit"]["credit"] is True and by["dus"]["dilation_base"] == 2 and by["dus"]["nfe"] < by["baseline"]["nfe"]


def test_cli_suite_table_json_and_csv(llada_dir, tmp_path):
    out = tmp_path / "s.json"
    run = CliRunner().invoke(app, ["bench", "--suite", "accelerators", "-m", str(llada_dir), "-n", "64",
                                   "-c", "baseline,dus,prophet,dkv", "--prompt-set", "code", "--n-prompts", "1",
                                   "--raw", "-r", "1", "--warmup", "0", "--output", str(out)], catch_exceptions=False)
    assert run.exit_code == 0, run.stderr
    reason = "prophet at gen_len 64: answer_anchor: offset 202 leaves no answer region"
    assert "dkv" in run.stdout and "parses" in run.stdout and f"left out: {reason}" in run.stdout
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["records"]] == ["baseline", "dus", "dkv"]
    assert data["left_out"][0].startswith(reason) and data["records"][2]["cache"] == "dkv"
    csv_out = tmp_path / "s.csv"
    run = CliRunner().invoke(app, ["bench", "--suite", "accelerators", "-m", str(llada_dir), "-n", "32",
                                   "-c", "baseline,dual+dus", "--n-prompts", "1", "--raw", "-r", "1", "--warmup", "0",
                                   "--output", str(csv_out)], catch_exceptions=False)
    assert run.exit_code == 0, run.stderr
    rows = list(csv.DictReader(csv_out.open()))
    assert [(r["config"], r["rule"], r["agreement_tokens"] != "") for r in rows] == [
        ("baseline", "fixed", True), ("dual+dus", "dilated", True)]
    assert rows[0]["prompt_set"] == "math"                                     # the suite's prompt set


def test_the_suite_writes_an_html_page_with_one_scatter_point_per_row(llada_dir, tmp_path):
    import base64
    import re

    from fastdllm.bench.format_html import scatter_points

    out = tmp_path / "s.html"
    run = CliRunner().invoke(app, ["bench", "--suite", "accelerators", "-m", str(llada_dir), "-n", "32",
                                   "-c", "baseline,dual+dus,local-leap,prophet", "--n-prompts", "1", "--raw", "-r", "1",
                                   "--warmup", "0", "--output", str(out)], catch_exceptions=False)
    assert run.exit_code == 0, run.stderr
    page = out.read_text()
    assert page.startswith("<!doctype html>") and page.count("<tr>") == 1 + 3          # the header and three rows
    assert "<h2>left out</h2>" in page and "prophet at gen_len 32" in page
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1))
    assert png.startswith(b"\x89PNG")
    records = [{"config": c, "gen_len": 32, "speedup": s, "agreement_tokens": a}
               for c, s, a in (("baseline", 1.0, 1.0), ("dus", 3.0, 0.5), ("dkv", None, None))]
    assert scatter_points(records) == [("baseline", 1.0, 1.0), ("dus", 0.5, 3.0)]     # rows without a baseline: none
