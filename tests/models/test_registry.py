"""The family registry (models/registry.py): modules found by their declarations, imported by name,
and registered with transformers' Auto classes however a family is reached, so that no checkpoint's
own Python (`auto_map`) is ever needed to read its config."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.fast
@pytest.mark.parametrize("reach", ["from fastdllm.models import LLaDAModelLM",
                                   "from fastdllm.models import registry; registry.families('llada')"])
def test_a_family_reached_by_class_or_by_type_reads_its_config_through_autoconfig(reach, tmp_path):
    # a fresh interpreter: the Auto classes of this process may have been registered by other tests
    (tmp_path / "config.json").write_text('{"model_type": "llada", "d_model": 64, "n_heads": 4, "n_layers": 1}')
    code = f"{reach}\nfrom transformers import AutoConfig\nprint(type(AutoConfig.from_pretrained({str(tmp_path)!r})).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == "LLaDAConfig", out.stdout + out.stderr[-500:]
