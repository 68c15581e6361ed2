"""`fastdllm bench`: sweep expansion, comparison arithmetic, formatters, prompt sets, a tiny
end-to-end run (runner and CLI), Ctrl+C keeping finished rows. No wall-clock assertions."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import Counter

import pytest
from cli_runner import invoke

from fastdllm.bench import format as bench_format
from fastdllm.bench import prompts
from fastdllm.bench import runner as bench
from fastdllm.bench.cases import CONFIGS, Sweep, expand, pick_rows
from fastdllm.bench.runner import Measured, agreement, compare
from fastdllm.decode.profiles import find
from fastdllm.errors import UsageError, UserError

NO_ENV: dict = {}                     # isolate expansion from FASTDLLM_* variables of the shell


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


# --- sweep expansion -----------------------------------------------------------------------------

def test_default_rows_are_the_documented_eight():
    cases = expand(pick_rows(None), Sweep(), environ=NO_ENV)
    got = {c.name: (c.cfg.cache, c.cfg.rule, c.cfg.total_steps if c.cfg.rule == "fixed" else None) for c in cases}
    assert got == {"baseline": ("none", "fixed", 256), "parallel": ("none", "threshold", None),
                   "parallel-factor": ("none", "factor", None), "prefix": ("prefix", "fixed", 256),
                   "dual": ("dual", "fixed", 256),
                   "prefix+parallel": ("prefix", "threshold", None), "dual+parallel": ("dual", "threshold", None),
                   "dual+factor": ("dual", "factor", None)}
    assert all(CONFIGS[name].doc for name in got)
    assert {c.cfg.threshold for c in cases if c.cfg.rule == "threshold"} == {0.9}
    assert {c.cfg.factor for c in cases if c.cfg.rule == "factor"} == {1.0}


def test_sweep_runs_every_combination():
    sweep = Sweep(gen_len=(32, 64), block_len=(8, 16), batch_size=(1, 2), threshold=(0.7, 0.9), factor=(0.5, 1.0, 1.5))
    cases = expand(pick_rows(None), sweep, environ=NO_ENV)
    # per group: 3 fixed rows + 3 threshold rows x 2 thresholds + 2 factor rows x 3 factors = 15
    assert len(cases) == 8 * 15
    groups = Counter(c.group for c in cases)
    assert set(groups) == {(g, b, n) for g in (32, 64) for b in (8, 16) for n in (1, 2)}
    assert set(groups.values()) == {15}
    for group in groups:
        rows = [c for c in cases if c.group == group]
        assert rows[0].name == "baseline"                                # baseline runs first in its group
        assert Counter(c.cfg.threshold for c in rows if c.cfg.rule == "threshold") == {0.7: 3, 0.9: 3}
        assert sorted(c.cfg.factor for c in rows if c.cfg.rule == "factor") == [0.5, 0.5, 1.0, 1.0, 1.5, 1.5]
    assert len(set(cases)) == len(cases)
    assert bench.count_runs(cases, n_prompts=4, repetitions=2, warmup=1) == 8 * 3 + sum(
        2 * (4 if c.batch_size == 1 else 2) for c in cases)   # 3 cache modes warmed per group


def test_configs_and_profile_rows():
    rows = pick_rows(["dual", "baseline"], [find("fast"), find("baseline")])
    assert [r.name for r in rows] == ["dual", "baseline", "fast", "profile:baseline"]
    cases = expand(rows, Sweep(gen_len=(64,), block_len=(16,), factor=(2.0,)), environ=NO_ENV)
    fast = next(c for c in cases if c.name == "fast")
    assert (fast.cfg.cache, fast.cfg.rule, fast.cfg.factor) == ("dual", "factor", 2.0)   # profile + sweep
    assert (fast.cfg.gen_len, fast.cfg.block_len) == (64, 16)
    with pytest.raises(UsageError, match="unknown configuration 'fastest'"):
        pick_rows(["fastest"])


def test_invalid_combination_is_one_line_before_running():
    with pytest.raises(UsageError, match="baseline at gen_len 48: gen_len 48 is not a multiple of block_len 32"):
        expand(pick_rows(["baseline"]), Sweep(gen_len=(48,)), environ=NO_ENV)


# --- arithmetic on hand-made records -----------------------------------------------------------

def record(config="baseline", tps=10.0, gen_len=32, block_len=8, batch_size=1, **extra):
    r = {"config": config, "cache": "none", "rule": "fixed", "threshold": None, "factor": None, "steps": gen_len,
         "gen_len": gen_len, "block_len": block_len, "batch_size": batch_size, "tokens_per_second": tps,
         "tokens_per_second_std": None, "speedup": None, "nfe": 64, "tokens_per_forward": 1.0,
         "agreement_tokens": None, "agreement_answers": None, "quality": 0.5, "quality_metric": "parses",
         "generated_tokens": 40, "seconds": 4.0, "peak_memory_bytes": 3 * 2**20, "peak_memory_kind": "process RSS",
         "cache_bytes": 2**20, "prompt_set": "code", "n_prompts": 2, "chat_template": False, "repetitions": 1,
         "warmup": 1, "model": "/m/tiny", "model_name": "tiny", "family": "llada", "device": "cpu",
         "dtype": "float32", "quantize": "none", "torch": "2", "transformers": "5", "fastdllm": "0.1.0"}
    r.update(extra)
    r["group"] = [r["gen_len"], r["block_len"], r["batch_size"]]          # the sweep's: one baseline each
    return r


def test_agreement_counts_positions_either_answer_generated():
    tokens, answers = agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5, 6]])
    assert tokens == pytest.approx(5 / 6) and answers == 0.5
    assert agreement([[7, 8], [9]], [[8, 7], [9]]) == (pytest.approx(1 / 3), 0.5)
    assert agreement([[]], [[]]) == (1.0, 1.0)


def test_speedup_and_agreement_against_the_baseline_of_the_same_group():
    ans = [[1, 2, 3, 4], [5, 6]]
    measured = [
        Measured(record("baseline", 10.0), ans),
        Measured(record("dual+parallel", 35.0, rule="threshold", threshold=0.9, steps=None), [[1, 2, 0, 4], [5, 6]]),
        Measured(record("dual", 20.0, block_len=16), ans),                 # another group: no baseline
        Measured(record("baseline", 8.0, batch_size=2), ans),
        Measured(record("dual", 24.0, batch_size=2), [[1, 2, 3, 4], [5]]),
    ]
    records = compare(measured)
    assert [r["speedup"] for r in records] == [1.0, 3.5, None, 1.0, 3.0]
    assert records[0]["agreement_tokens"] == 1.0 and records[0]["agreement_answers"] == 1.0
    assert records[1]["agreement_tokens"] == pytest.approx(5 / 6, abs=1e-4) and records[1]["agreement_answers"] == 0.5
    assert records[2]["agreement_tokens"] is None
    assert records[4]["agreement_tokens"] == pytest.approx(5 / 6, abs=1e-4)


# --- formatters: one schema, five renderings ---------------------------------------------------

@pytest.fixture
def records():
    return compare([Measured(record("baseline", 10.0), [[1, 2]]),
                    Measured(record("dual+parallel", 30.0, cache="dual", rule="threshold", threshold=0.8,
                                    steps=None, nfe=20, tokens_per_forward=3.2, tokens_per_second_std=1.25), [[1, 3]])])


def test_machine_formats_carry_every_field(records):
    assert json.loads(bench_format.render(records, "json")) == {"records": records}
    lines = bench_format.render(records, "jsonl").splitlines()
    assert [json.loads(line) for line in lines] == records
    rows = list(csv.DictReader(io.StringIO(bench_format.render(records, "csv"))))
    assert len(rows) == 2 and list(rows[0]) == list(records[0])
    assert rows[1]["config"] == "dual+parallel" and float(rows[1]["speedup"]) == 3.0


def test_human_formats_show_comparisons_and_move_constants_to_the_caption(records):
    md = bench_format.render(records, "md")
    head, sep, *body = md.split("\n\n")[0].splitlines()
    assert head.split(" | ")[0] == "| config" and "speedup" in head and "parses" in head
    assert "gen" not in head.split(" | ")                               # not swept: in the caption
    assert sep.startswith("|---|") and len(body) == 2
    assert "| dual+parallel | dual | t=0.8 |" in body[1] and "3.00x" in body[1] and "50.0%" in body[1]
    assert "| 30.0 |" in body[1] and "1/step" in body[0] and "spread" not in head   # one repetition
    caption = md.split("\n\n")[1]
    assert "tiny (llada, cpu, float32)" in caption and "gen_len 32" in caption and "2 code prompts, raw" in caption
    text = bench_format.render(records, "table")
    assert "dual+parallel" in text and "3.00x" in text and "same tok" in text and "gen_len 32" in text


def test_swept_columns_appear_when_values_vary(records):
    more = records + [record("baseline", 5.0, gen_len=64)]
    headers, rows, caption = bench_format.cells(more)
    assert "gen" in headers and "gen_len" not in caption and [r[headers.index("gen")] for r in rows] == ["32", "32", "64"]


def test_format_from_flag_or_suffix(tmp_path):
    assert bench_format.format_for(None, None) == "table"
    assert bench_format.format_for(None, tmp_path / "r.csv") == "csv"
    assert bench_format.format_for("md", tmp_path / "r.csv") == "md"
    with pytest.raises(UsageError, match="--format xml"):
        bench_format.format_for("xml", None)
    with pytest.raises(UsageError, match="suffix"):
        bench_format.format_for(None, tmp_path / "r.xlsx")


def test_plot_without_matplotlib_is_a_one_line_error(records, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)               # import fails
    with pytest.raises(UserError, match=r"pip install 'fastdllm\[plot\]'"):
        bench_format.plot(records, tmp_path / "p.png")


def test_plot_writes_a_png(records, tmp_path):
    bench_format.plot(records + [record("baseline", 6.0, gen_len=64)], tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# --- prompt sets ---------------------------------------------------------------------------------

def test_builtin_sets_and_quality_signals():
    code = prompts.builtin("code").take(2)
    assert code.quality(["    return max(low, min(value, high))\n", "    return (\n"]) == 0.5
    assert prompts.builtin("chat").quality(["anything"]) is None
    math = prompts.builtin("math").take(2)
    assert math.quality([" 12 + 5 = 17, 17 - 4 = 13. The answer is 13.\n\nQuestion: 2", "6 * 8 = 48"]) == 1.0
    with pytest.raises(UsageError, match="has 12 prompts"):
        prompts.builtin("chat").take(13)
    with pytest.raises(UsageError, match="unknown prompt set"):
        prompts.builtin("poems")


def test_prompts_file_jsonl_or_lines(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a\\nb"}\n\n{"prompt": "c"}\n')
    assert prompts.from_file(tmp_path / "p.jsonl").prompts == ["a\nb", "c"]
    (tmp_path / "p.txt").write_text("first\nsecond\n")
    assert prompts.from_file(tmp_path / "p.txt").prompts == ["first", "second"]
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(UsageError, match='bad.jsonl:1: expected an object with a "prompt"'):
        prompts.from_file(tmp_path / "bad.jsonl")


# --- end to end on the tiny random model -------------------------------------------------------

@pytest.mark.slow
def test_runner_returns_records_with_nfe_order_and_self_agreement(llada64):
    rows = pick_rows(["baseline", "dual", "dual+parallel"])
    # no early stop: every row decodes the whole canvas, so NFEs compare like for like
    cases = expand(rows, Sweep(gen_len=(32,), block_len=(8,)), environ={"FASTDLLM_EARLY_STOP": "false"})
    chosen = prompts.PromptSet("t", ["def f(x):\n", "Hello there"])
    records = compare(list(bench.measure(llada64, cases, chosen, chat=False, warmup=1, repetitions=2)))
    by = {r["config"]: r for r in records}
    assert by["dual+parallel"]["nfe"] <= by["dual"]["nfe"] <= by["baseline"]["nfe"] == 2 * 32
    assert by["baseline"]["agreement_tokens"] == 1.0 and by["baseline"]["agreement_answers"] == 1.0
    assert by["baseline"]["speedup"] == 1.0
    assert by["dual"]["cache_bytes"] > 0 and by["baseline"]["tokens_per_second_std"] is not None
    for r in records:
        assert r["n_prompts"] == 2 and r["repetitions"] == 2 and r["dtype"] == "float64" and r["family"] == "llada"
        assert r["torch"] and r["transformers"] and r["fastdllm"] and r["prompt_set"] == "t"
        assert 0.0 <= r["agreement_tokens"] <= 1.0 and r["quality"] is None


def test_positions_per_forward_are_the_spans_each_cache_mode_runs(llada64):
    """Result.positions_run (engine.generate) is the canvas positions the forwards ran: the whole
    canvas at every step without a cache, the block and what follows it (prefix) or the block alone
    (dual) after each block's first step, which runs the whole canvas; the bench record's
    positions_per_forward is it over NFE, and answer_tokens the mean answer length."""
    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.engine import run

    prompt = llada64.encode("def f(x):\n", chat=False)
    P, G, L = len(prompt), 32, 8
    T, steps = P + G, L                                    # one token a step: L steps per block
    spans = {"none": [T] * (G // L * steps),
             "prefix": [w for k in range(G // L) for w in [T] + [T - (P + L * k)] * (steps - 1)],
             "dual": [w for k in range(G // L) for w in [T] + [L] * (steps - 1)]}
    for mode, widths in spans.items():
        cfg = DecodeConfig(gen_len=G, block_len=L, cache=mode, rule="fixed", early_stop=False)
        result = run(llada64.decoder, [prompt], cfg)
        assert result.nfe == len(widths) and result.positions_run == sum(widths), mode
    cases = expand(pick_rows(["baseline", "dual"]), Sweep(gen_len=(G,), block_len=(L,)),
                   environ={"FASTDLLM_EARLY_STOP": "false"})
    records = compare(list(bench.measure(llada64, cases, prompts.PromptSet("t", ["def f(x):\n"]), chat=False,
                                         warmup=0, repetitions=1)))
    by = {r["config"]: r for r in records}
    assert by["baseline"]["positions_per_forward"] == T
    assert by["dual"]["positions_per_forward"] == round(sum(spans["dual"]) / len(spans["dual"]), 1)
    assert all(r["answer_tokens"] == r["generated_tokens"] for r in records)     # one prompt
    text = bench_format.render(records, "md")
    assert "| answer | pos/fwd |" in text and "canvas positions a forward runs" in text


def test_cli_bench_json_and_output_file(llada_dir, tmp_path):
    out = tmp_path / "r.csv"
    r = invoke("bench", "-m", llada_dir, "-n", "16", "--block-len", "8", "-c", "baseline,dual+parallel", "--threshold", "0.5,0.9",
               "--prompt-set", "code", "--n-prompts", "2", "--raw", "--warmup", "0", "--output", out)
    assert r.exit_code == 0, r.stderr
    assert "dual+parallel" in r.stdout and "t=0.5" in r.stdout and "same tok" in r.stdout   # table on stdout
    rows = list(csv.DictReader(out.open()))
    assert [(x["config"], x["threshold"]) for x in rows] == [("baseline", ""), ("dual+parallel", "0.5"),
                                                             ("dual+parallel", "0.9")]
    assert rows[0]["quality_metric"] == "parses" and rows[0]["chat_template"] == "False"


@pytest.mark.slow
def test_cli_quantized_rows_agree_with_the_same_row_unquantized(llada_dir, monkeypatch):
    pytest.importorskip("bitsandbytes")
    import fastdllm.cli.bench as cli_bench

    real, loads = cli_bench.load_model, []
    monkeypatch.setattr(cli_bench, "load_model", lambda path, **p: (loads.append(p), real(path, **p))[1])
    r = invoke("bench", "-m", llada_dir, "-n", "16", "--block-len", "8", "-c", "baseline,dual+parallel", "--n-prompts", "2",
               "--raw", "--warmup", "0", "-r", "1", "--quantize", "8bit", "--dtype", "fp32", "-o", "jsonl")
    assert r.exit_code == 0, r.stderr
    one_device = {"device_map": "", "max_memory": ""}
    assert loads == [{"dtype": "fp32", "device": "auto", "quantize": "8bit", **one_device},  # timed: quantized
                     {"dtype": "fp32", "device": "auto", "quantize": "none", **one_device}]  # then the reference
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["config"] for x in rows] == ["baseline", "dual+parallel"] and rows[0]["quantize"] == "8bit"
    for x in rows:
        assert 0.0 <= x["agreement_unquantized_tokens"] <= 1.0 and 0.0 <= x["agreement_unquantized_answers"] <= 1.0
    assert "same tok unquant." in bench_format.render(rows, "table")


def test_unquantized_agreement_is_against_the_same_case():
    measured = [Measured(record("baseline", 10.0), [[1, 2, 3, 4]], unquantized=[[1, 2, 3, 4]]),
                Measured(record("dual", 20.0), [[1, 2, 0, 4]], unquantized=[[1, 2, 0, 0]])]
    records = compare(measured)
    assert records[0]["agreement_unquantized_tokens"] == 1.0 and records[1]["agreement_unquantized_tokens"] == 0.75
    assert records[1]["agreement_tokens"] == 0.75 and records[1]["agreement_unquantized_answers"] == 0.0
    assert compare([Measured(record("baseline"), [[1]])])[0].get("agreement_unquantized_tokens") is None


@pytest.mark.parametrize("args, message", [
    (["-n", "30", "--block-len", "8"], "gen_len 30 is not a multiple of block_len 8"),
    (["--threshold", "0.5,1.5"], "threshold: 1.5 is above the maximum 1.0"),
    (["--batch-size", "0"], "--batch-size"),
    (["--format", "xml"], "--format xml"),
    (["-c", "turbo"], "unknown configuration 'turbo'"),
    (["-r", "0"], "--repetitions 0"),
    (["-r", "often"], "--repetitions often: give a count or 'auto'"),
    (["--prompt-set", "math", "--n-prompts", "99"], "has 12 prompts"),
    (["--prompt-set", "code", "--prompts", "x.txt"], "not both"),
])
def test_cli_usage_errors_are_one_line_exit_2(llada_dir, args, message):
    r = invoke("bench", "-m", llada_dir, *args)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_ctrl_c_keeps_finished_rows(llada_dir, monkeypatch):
    from fastdllm.bench import clock

    real_run, calls = clock.run, []

    def interrupted_on_third(*args, **kwargs):             # one run per row here: rows 1-2 finish
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    monkeypatch.setattr(clock, "run", interrupted_on_third)
    r = invoke("bench", "-m", llada_dir, "-n", "16", "--block-len", "8", "-c", "baseline,dual,dual+parallel",
               "--n-prompts", "1", "--warmup", "0", "-r", "1", "-o", "jsonl")
    assert r.exit_code == 130
    assert [json.loads(line)["config"] for line in r.stdout.splitlines()] == ["baseline", "dual"]
    assert "interrupted" in r.stderr and "2 of 3 rows" in r.stderr
