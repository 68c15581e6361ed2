"""benchmarks/: every benchmark imports and parses its options on the harness; the harness's
repetitions interleave and its spread is what it says; one benchmark runs end to end at a tiny
shape and writes its JSON (slow lane)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
ON_HARNESS = sorted(p.stem for p in BENCH.glob("*.py") if "harness.parser(" in p.read_text())


@pytest.fixture
def bench_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))      # as `python benchmarks/NAME.py` puts it first


def test_the_benchmarks_use_one_harness():
    assert {"speed", "step_profile", "moe_speed", "cpu_quant_kernels", "blockdiff_speed", "vs_llamacpp",
            "vs_authors", "serve_bench", "diffusion_gemma_cost"} <= set(ON_HARNESS)
    for p in BENCH.glob("*.py"):                 # the parts the harness holds are not written again
        text = p.read_text()
        assert "def cpu_name" not in text or p.stem == "harness", p.name
        assert "def read_bandwidth" not in text or p.stem == "harness", p.name
        assert len(text.splitlines()) <= 300, p.name


@pytest.mark.parametrize("name", ON_HARNESS)
def test_every_benchmark_parses_its_options(name, bench_path, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--threads" in out and "--json" in out


def test_interleaved_runs_round_by_round_after_the_warm_up(bench_path):
    import harness

    calls = []
    runs = {k: (lambda k=k: calls.append(k) or len(calls)) for k in "ab"}
    out = harness.interleaved(runs, reps=2, warmup=1)
    assert calls == list("ababab")                       # one warm-up round, then A B A B
    assert out == {"a": [3, 5], "b": [4, 6]}             # warm-up results not kept


def test_spread_is_range_over_median(bench_path):
    import harness

    assert harness.spread([1.0, 2.0, 4.0]) == {"median": 2.0, "min": 1.0, "max": 4.0, "n": 3, "spread": 1.5}
    assert harness.spread([3.0])["spread"] is None
    assert harness.span([1.0, 2.5]) == "1-2.5" and harness.span([1.0]) == "-"
    assert harness.csv("1, 8,,32", int) == [1, 8, 32]


@pytest.mark.slow
def test_speed_runs_at_a_tiny_shape_and_writes_json(tmp_path):
    out = tmp_path / "speed.json"
    cmd = [sys.executable, str(BENCH / "speed.py"), "--d-model", "64", "--layers", "2", "--heads", "4", "--mlp", "128",
           "--vocab", "1000", "--prompt", "8", "--gen-len", "32", "--modes", "none,dual", "--dtype", "fp32",
           "--in-memory", "--threads", "1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [r["mode"] for r in report["records"]] == ["none", "dual"]
    assert all(r["nfe"] == 32 for r in report["records"])            # one token per step
    assert "cpu" in report["conditions"]["machine"]


def test_vs_llamacpp_names_an_unknown_precision_in_one_line():
    # before any build or download; a subprocess, as harness.parse sets the allocator for its process
    r = subprocess.run([sys.executable, str(BENCH / "vs_llamacpp.py"), "--precisions", "f32,fp32"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(
        "error: --precisions fp32: expected some of f32,bf16,q8_0,q4_0 (or none)")


def test_peak_memory_is_each_process_own(bench_path, llada_dir):
    """vs_llamacpp's peak RSS: llama.cpp's runs through llamacpp_runs.measured (wait4: that child alone,
    not the largest child so far), fastdllm's from a fresh process that loads and decodes once."""
    import llamacpp_runs

    from fastdllm.decode.config import DecodeConfig

    grow = "import sys; b = bytearray(int(sys.argv[1])); b[::4096] = b'x' * len(b[::4096]); print('ok')"
    big = llamacpp_runs.measured([sys.executable, "-c", grow, str(300 * 2 ** 20)])
    small = llamacpp_runs.measured([sys.executable, "-c", grow, "0"])
    assert big.returncode == small.returncode == 0 and big.stdout == "ok\n"
    assert big.peak_rss_bytes > 300 * 2 ** 20 > small.peak_rss_bytes
    cfg = DecodeConfig(gen_len=8, block_len=8, cache="dual", rule="threshold", threshold=0.9, early_stop=False)
    peak = llamacpp_runs.fastdllm_peak(llada_dir, "fp32", [5, 6, 7], cfg, threads=1)
    assert 1 <= peak["forwards"] <= 8 and peak["peak_rss_bytes"] > small.peak_rss_bytes
