"""The fit verdict (checkpoints/fit.py): on simulated machines, what cannot fit is refused in one
line naming the form that would, before any weight is read; --force loads anyway."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fastdllm.checkpoints.builtin import builtin_model_path
from fastdllm.cli.app import app
from fastdllm.checkpoints import catalog, fit
from fastdllm.checkpoints.locate import resolve_model_dir

GIB = 2**30
DREAM = catalog.entries()["dream:7b"]
# dream:7b's totals as the catalog holds them (weights + a 384-token bf16 cache)
TOTALS = fit.with_float_widths({p: {"total": int(DREAM.memory_gib(p) * GIB)} for p in catalog.PRECISIONS})


def test_what_fits_is_not_refused():
    assert fit.refusal("dream:7b", TOTALS, "bf16", fit.Machine("gpu", "this GPU", 24 * GIB)) is None


def test_a_gpu_too_small_for_bf16_is_told_the_quantization_that_fits():
    line = fit.refusal("dream:7b", TOTALS, "bf16", fit.Machine("gpu", "this GPU", int(11.7 * GIB)))
    assert line == ("dream:7b needs 14.2 GiB at bf16; this GPU has 11.7 GiB free: try --quantize 8bit (8.1 GiB), "
                    "or --force to load anyway")
    # 8 GiB free: 8-bit (8.1 + 1 GiB headroom) does not fit either, 4-bit does
    assert "try --quantize 4bit (5.5 GiB)" in fit.refusal("dream:7b", TOTALS, "8bit", fit.Machine("gpu", "cuda:1", 8 * GIB))


def test_nothing_fits_says_so():
    line = fit.refusal("dream:7b", TOTALS, "bf16", fit.Machine("gpu", "this GPU", 4 * GIB))
    assert "even the smallest form needs 5.5 GiB" in line and "fastdllm recommend" in line


def test_a_cpu_is_offered_bf16_then_its_int8_and_int4_kernels():
    ram = fit.Machine("cpu", "this machine's RAM", 20 * GIB)
    assert fit.chosen_key("cpu", "auto", "none") == "fp32" and fit.chosen_key("gpu", "auto", "none") == "bf16"
    assert "try --dtype bf16 (14.2 GiB)" in fit.refusal("dream:7b", TOTALS, "fp32", ram)
    int8 = dict(TOTALS, int8=int(7.9 * GIB), int4=int(4.9 * GIB))
    assert "try --quantize int8 (7.9 GiB)" in fit.refusal("dream:7b", int8, "fp32", fit.Machine("cpu", "this machine's RAM", 10 * GIB))
    # packed experts (DiffusionGemma) cannot take the CPU kernels: never offered
    assert "int" not in fit.refusal("dream:7b", int8, "fp32", fit.Machine("cpu", "RAM", 10 * GIB), packed_experts=True)


def test_the_estimate_of_a_checkpoint_is_read_from_its_headers():
    totals, packed, cache, layers = fit.estimate(resolve_model_dir(None), 384)
    assert not packed and totals["fp32"] == 2 * totals["bf16"] > totals["int8"] > 0
    assert 0 < cache < totals["bf16"] and layers > 0


@pytest.fixture
def small_machine(monkeypatch):
    monkeypatch.setattr(fit, "this_machine", lambda device="auto": fit.Machine("cpu", "this machine's RAM", 512 * 2**20))


def test_generate_refuses_in_one_line_before_loading_and_force_loads(small_machine, monkeypatch):
    from fastdllm.checkpoints import loading

    calls = []
    monkeypatch.setattr(loading, "load", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(SystemExit(3)))
    out = CliRunner().invoke(app, ["generate", "hi", "-n", "32"])
    assert out.exit_code == 1 and calls == []
    assert out.output.startswith(f"error: {builtin_model_path().name} needs ") and out.output.count("\n") == 1
    assert "this machine's RAM has 0.5 GiB free" in out.output
    forced = CliRunner().invoke(app, ["generate", "hi", "-n", "32", "--force"])
    assert calls and forced.exit_code == 3                   # it went on to load


def test_fastdllm_force_is_the_same_as_the_flag(small_machine, monkeypatch):
    from fastdllm.checkpoints import loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: (_ for _ in ()).throw(SystemExit(3)))
    monkeypatch.setenv("FASTDLLM_FORCE", "1")
    assert CliRunner().invoke(app, ["generate", "hi", "-n", "32"]).exit_code == 3
