"""scripts/eval_tiny.py, the evaluation behind the built-in model's card: on two held-out prompts it
measures every setting against the baseline and rewrites a card while keeping its hand-written part."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from fastdllm.bench.runner import agreement
from fastdllm.checkpoints.builtin import builtin_model_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "eval_tiny.py"


pytestmark = pytest.mark.slow   # a whole evaluation of the built-in model: the full suite only


def load_script():
    spec = importlib.util.spec_from_file_location("eval_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eval_figures_and_card(tmp_path):
    eval_tiny = load_script()
    model_dir = tmp_path / "tiny-code"
    shutil.copytree(builtin_model_path(), model_dir)
    card = model_dir / "README.md"
    card.write_text("old generated card\n" + eval_tiny.HAND_WRITTEN + "\n\n## A hand-written experiment\n")

    figures = eval_tiny.evaluate(model_dir, 2)

    settings = figures["settings"]
    assert figures["prompts"] == 2 and set(settings) == {"baseline", "fast", "fast_no_cache", "fast_prefix", "profile"}
    assert {s["config"]["block_len"] for s in settings.values()} == {32}      # the code profile's blocks
    assert settings["fast"]["config"]["cache"] == "dual" and settings["fast"]["config"]["threshold"] == 0.9
    assert settings["profile"]["config"]["threshold"] == 0.8
    base = settings["baseline"]
    assert base["tokens_per_forward"] == 1.0 and base["token_agreement"] == 1.0 and base["identical_answers"] == 1.0
    for name, s in settings.items():               # the figures are the product's agreement of the answers
        pooled, identical = agreement(figures["answers"][name], figures["answers"]["baseline"])
        assert (s["token_agreement"], s["identical_answers"]) == (pooled, identical)
    assert settings["fast"]["tokens_per_forward"] > 1.0
    assert 3.0 < figures["heldout_loss"] < 9.0     # between a trained model and uniform over 4096 (8.3)

    eval_tiny.write_card(model_dir, figures)
    text = card.read_text()
    assert text.startswith("# tiny-code") and "old generated card" not in text
    assert "2 held-out prompts" in text and f"{settings['fast']['tokens_per_forward']:.2f}" in text
    assert text.endswith(eval_tiny.HAND_WRITTEN + "\n\n## A hand-written experiment\n")


def test_block_len_override_moves_both_settings():
    eval_tiny = load_script()
    configs = eval_tiny.settings(builtin_model_path(), block_len=64)
    assert {cfg.block_len for cfg in configs.values()} == {64}
    assert configs["baseline"].cache == "none" and configs["fast_prefix"].cache == "prefix"
