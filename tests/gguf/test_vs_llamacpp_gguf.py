"""benchmarks/vs_llamacpp_gguf.py: which fastdllm precision a GGUF file's types map to, and the
precision column llama.cpp's rows show."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def gguf_mode(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))      # as `python benchmarks/NAME.py` puts it first
    return importlib.import_module("vs_llamacpp_gguf")


@pytest.mark.parametrize("types, precision, label", [
    (["F32"], "fp32", "f32"),
    (["BF16", "F32"], "bf16", "bf16"),
    (["F16", "F32"], "bf16", "f16"),
    (["Q8_0", "F32"], "int8", "q8_0"),
    (["Q4_0", "F32", "Q6_K"], "int4", "q4_0+q6_k"),
    (["Q4_K", "Q6_K", "F32"], "int4", "q4_k+q6_k"),      # a Q4_K_M file
])
def test_a_files_types_pick_fastdllms_precision(gguf_mode, types, precision, label):
    assert gguf_mode.precision_of(types) == precision
    assert gguf_mode.llama_label(types) == label


def test_vs_llamacpp_dispatches_gguf(monkeypatch, gguf_mode):
    import sys

    vs = importlib.import_module("vs_llamacpp")
    seen = []
    monkeypatch.setattr(gguf_mode, "main", lambda env=None: seen.append(env))
    monkeypatch.setattr(sys, "argv", ["vs_llamacpp.py", "--gguf=x.gguf"])
    vs.main()
    assert seen and isinstance(seen[0], dict)
