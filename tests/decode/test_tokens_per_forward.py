"""Tokens per forward counts answer tokens (up to the end token); the positions committed per
forward, the end padding after the answer included, stand beside it. Every place that reports it
says so: the stats line and block, `--json`, bench's records and table, serve's usage and
metrics, analyze's record and advice."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastdllm.cli.app import app
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.events import Result
from fastdllm.terminal.stats import stats_block, stats_line

runner = CliRunner()


def padded(answer: int = 4, committed: int = 32, nfe: int = 17, batch: int = 1) -> Result:
    """The issue's run: a 4-token answer, then end tokens committed in parallel to fill the block."""
    return Result(ids=[list(range(10, 10 + answer))] * batch, texts=["x"] * batch, canvas=None,
                  prompt_tokens=[8] * batch, nfe=nfe, committed=committed * batch, edits=0, blocks_decoded=1,
                  early_stopped=True, seconds_first_step=0.07, seconds_total=0.4, peak_memory_bytes=2**20,
                  peak_memory_kind="process RSS", cache_bytes=2**20, config=DecodeConfig(gen_len=128), batch=batch)


def test_the_headline_counts_answer_tokens_and_committed_positions_stand_beside_it():
    r = padded()
    assert r.tokens_per_forward == pytest.approx(4 / 17) and r.committed_per_forward == pytest.approx(32 / 17)
    two = padded(batch=2)                                        # per forward of a row
    assert two.tokens_per_forward == pytest.approx(4 / 17) and two.committed_per_forward == pytest.approx(32 / 17)
    d = r.to_dict()
    assert (d["tokens_per_forward"], d["committed_per_forward"], d["committed"]) == (0.2353, 1.8824, 32)


def test_the_stats_say_what_they_count():
    line = stats_line(padded())
    assert line.startswith("4 tokens · 17 forwards · 0.24 tok/forward (1.88 committed) · ")
    block = dict(row.split(":", 1) for row in stats_block(padded(), {"device": "cpu", "dtype": "fp32"}).splitlines())
    assert block["forwards (NFE)"].strip() == ("17, 0.24 answer tokens each (1.88 positions committed, "
                                               "end padding included)")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_generate_json_carries_both_figures(llada_dir):
    r = invoke("generate", "-m", llada_dir, "-n", "32", "--block-len", "16", "--threshold", "0.5", "--json", "def f(x):")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["tokens_per_forward"] == round(d["generated_tokens"] / d["nfe"], 4)
    assert d["committed_per_forward"] == round(d["committed"] / d["nfe"], 4)
    assert d["committed"] >= d["generated_tokens"]


def test_bench_records_and_table_carry_both_figures(llada_dir):
    args = ("bench", "-m", llada_dir, "-n", "16", "--block-len", "16", "-c", "baseline,dual+parallel",
            "--n-prompts", "2", "--warmup", "0", "-r", "1")
    r = invoke(*args, "--format", "jsonl")
    assert r.exit_code == 0, r.stderr
    for row in map(json.loads, r.stdout.splitlines()):
        per_answer = row["generated_tokens"] / row["n_prompts"]
        assert row["tokens_per_forward"] == round(row["generated_tokens"] / row["nfe"], 3)   # batch 1: a forward, a row
        assert row["answer_tokens"] == round(per_answer, 1) and row["committed_per_forward"] >= row["tokens_per_forward"]
    table = invoke(*args, "--format", "table").stdout
    assert "commit/fwd" in table.splitlines()[1]
    caption = " ".join(table.split())                              # the caption wraps with the table's width
    assert "tok/fwd: answer tokens (up to the end token) per forward; commit/fwd: positions committed" in caption


def test_serve_usage_and_metrics_count_answer_tokens():
    pytest.importorskip("prometheus_client")
    from fastdllm.serve.jobs import Finished
    from fastdllm.serve.metrics import Metrics
    from fastdllm.serve.responses import usage

    f = Finished(text="x", ids=[5, 6, 7, 8], finish_reason="stop", prompt_tokens=8, completion_tokens=4, nfe=17,
                 committed=32, seconds=1.0, queued_seconds=0.0, mean_batch=1.0)
    u = usage(f)
    assert (u["tokens_per_forward"], u["committed_per_forward"]) == (0.2353, 1.8824)
    metrics = Metrics()
    metrics.finished(f)
    gauge = next(line for line in metrics.render().decode().splitlines() if line.startswith("fastdllm_tokens_per_forward "))
    assert float(gauge.split()[1]) == pytest.approx(4 / 17)


def test_analyze_reports_both(llada64):
    from fastdllm.bench.analyze import record
    from fastdllm.bench.analyze_report import advice

    data = record(padded(), [], DecodeConfig(gen_len=128))
    assert (data["tokens_per_forward"], data["committed_per_forward"]) == (0.2353, 1.8824)
    data.update(baseline={"nfe": 128}, drift={}, sweep=[])
    assert any("0.24 answer tokens per forward, 1.88 positions committed" in line for line in advice(data))
