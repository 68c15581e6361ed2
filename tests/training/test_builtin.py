"""The built-in models, as installed: found without a path, loaded through the normal LLaDA path,
deterministic, and the default one the model of `fastdllm generate`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.builtin import builtin_model_path, builtin_models
from fastdllm.cli.app import app
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run

PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def builtin():
    path = builtin_model_path()
    assert path is not None, "the built-in model is not installed with the package"
    return loading.load(path)


@pytest.mark.parametrize("name", [p.name for p in builtin_models()])
def test_shipped_in_llada_format(name):
    path = builtin_model_path(name)
    lm = loading.load(path)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llada" and config["architectures"] == ["LLaDAModelLM"]
    assert type(lm.model).__name__ == "LLaDAModelLM"
    assert sum(f.stat().st_size for f in path.iterdir()) < 64 * 2**20
    assert (path / "README.md").is_file()                                # the model card
    assert lm.specials.mask == lm.tokenizer.convert_tokens_to_ids("<|mdm_mask|>")
    assert lm.has_chat_template == (name == "tiny-llada")                # chat and serve's chat template


@pytest.mark.slow
def test_greedy_generation_is_deterministic(builtin):
    cfg = DecodeConfig(gen_len=64, block_len=32, cache="dual", threshold=0.9)
    ids = builtin.encode(PROMPT, chat=False)
    first, second = run(builtin.decoder, [ids], cfg), run(builtin.decoder, [ids], cfg)
    assert first.canvas.tolist() == second.canvas.tolist()
    expected = EXPECTED_START[builtin.path.name]
    assert first.ids[0][:len(expected)] == expected


def test_generate_uses_it_by_default_with_its_model_defaults():
    r = CliRunner().invoke(app, ["generate", "--json", "-P", "code", PROMPT], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["model"]["path"] == str(builtin_model_path())
    generation = json.loads((builtin_model_path() / "generation_config.json").read_text())
    assert record["config"]["gen_len"] == generation["fastdllm"]["gen_len"]   # the model-defaults layer
    assert record["config"]["block_len"] == 32 and record["config"]["threshold"] == 0.8   # the code profile
    assert record["nfe"] >= 1 and record["generated_tokens"] > 0


# The first tokens of the greedy answer to PROMPT (gen_len 64, block 32, DualCache, threshold 0.9),
# recorded from each shipped checkpoint; they change only when the checkpoint or the decoding does.
EXPECTED_START: dict[str, list[int]] = {"tiny-code": [264, 388, 56, 755, 290, 277, 704, 391]}


def test_each_builtin_model_is_found_by_name_and_listed():
    from fastdllm.checkpoints.builtin import NAMES, builtin_models
    from fastdllm.checkpoints.locate import resolve_model_dir
    from fastdllm.checkpoints.store import local_models

    installed = builtin_models()
    assert installed and installed[0] == builtin_model_path()          # the default comes first
    for path in installed:
        assert path.name in NAMES and resolve_model_dir(path.name) == path
    listed = {m.name for m in local_models() if m.where == "built-in"}
    assert listed == {p.name for p in installed}
    assert builtin_model_path("no-such-model") is None
