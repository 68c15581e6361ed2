"""Checkpoints in the official layouts: round trip, special ids from the checkpoint, clear errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES
from safetensors import safe_open

from fastdllm.checkpoints import loading, specials
from fastdllm.errors import UserError


def _names(pattern_source: dict) -> set[str]:
    """Tensor names with layer numbers folded, e.g. model.transformer.blocks.N.q_proj.weight."""
    return {re.sub(r"\.\d+\.", ".N.", k) for k in pattern_source}


@pytest.mark.parametrize("family, fixture", [("llada", "LLaDA-8B-Instruct"), ("dream", "Dream-v0-Instruct-7B")])
def test_round_trip_in_official_layout(family, fixture, request):
    path: Path = request.getfixturevalue(f"{family}_dir")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((path / s).is_file() for s in shards)
    published = json.loads((FIXTURES / fixture / "model.safetensors.index.json").read_text())
    assert _names(index["weight_map"]) == _names(published["weight_map"])        # real tensor names
    with safe_open(str(path / sorted(shards)[0]), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())   # bf16 on disk
    config = json.loads((path / "config.json").read_text())
    real = json.loads((FIXTURES / fixture / "config.json").read_text())
    assert set(real) <= set(config)                                             # published config keys
    lm = loading.load(path, dtype="fp32")
    with safe_open(str(path / sorted(shards)[0]), "pt") as f:
        name = next(iter(f.keys()))
        assert torch.equal(lm.model.state_dict()[name], f.get_tensor(name).float())


def test_special_ids_come_from_the_checkpoint(llada64, dream64):
    tok = llada64.tokenizer
    assert llada64.specials.mask == tok.convert_tokens_to_ids("<|mdm_mask|>")
    assert llada64.specials.eot == tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.convert_tokens_to_ids("<|endoftext|>") in llada64.specials.stops
    # Dream: the real tokenizer files, ids as published
    assert dream64.specials.mask == 151666
    assert dream64.specials.eot == 151645 and 151643 in dream64.specials.stops
    assert dream64.tokenizer.decode(dream64.encode("def f(x):\n    return x", chat=False)) == "def f(x):\n    return x"
    assert dream64.encode("hi", chat=True)[:3] == dream64.tokenizer("<|im_start|>system\n")["input_ids"]


def test_published_tokenizer_configs_load_without_running_code(tmp_path):
    """Dream's tokenizer_config names DreamTokenizer with an auto_map to a .py file; we never run it."""
    src = FIXTURES / "Dream-v0-Instruct-7B"
    tok = specials.load_tokenizer(src)
    assert type(tok).__name__ == "Qwen2Tokenizer" and tok.chat_template
    assert specials.end_of_turn(tok) == 151645


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_errors_are_one_line_user_errors(llada_dir, tmp_path):
    cases = []
    cases.append((tmp_path / "nope", "model directory not found"))
    d = _copy(llada_dir, tmp_path / "bad-json")
    (d / "config.json").write_text("{not json")
    cases.append((d, "cannot read"))
    d = _copy(llada_dir, tmp_path / "unknown-type")
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    cases.append((d, "unsupported model_type 'gpt2'"))
    d = _copy(llada_dir, tmp_path / "moe")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, architectures=["FusedLLaDAMoEModelLM"])))
    cases.append((d, "unsupported architecture"))
    d = _copy(llada_dir, tmp_path / "moe-keys")     # LLaDA-MoE by its architecture, dense LLaDA by its keys
    (d / "config.json").write_text(json.dumps(dict(cfg, architectures=["LLaDAMoEModelLM"])))
    cases.append((d, "required keys missing: hidden_size, num_hidden_layers"))
    d = _copy(llada_dir, tmp_path / "no-tokenizer")
    (d / "tokenizer.json").unlink()
    cases.append((d, "no tokenizer files"))
    d = _copy(llada_dir, tmp_path / "missing-shard")
    next(d.glob("model-00001-*.safetensors")).unlink()
    cases.append((d, "missing weight shards"))
    d = _copy(llada_dir, tmp_path / "no-weights")
    for f in d.glob("model*"):
        f.unlink()
    cases.append((d, "no model.safetensors"))
    d = _copy(llada_dir, tmp_path / "corrupt")
    next(d.glob("model-00001-*.safetensors")).write_bytes(b"garbage")
    cases.append((d, "cannot load weights"))
    d = _copy(llada_dir, tmp_path / "alibi")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, alibi=True)))
    cases.append((d, "config.json sets alibi=True (ALiBi attention biases); fastdllm's llada (LLaDAModelLM) does not implement it yet"))
    for path, message in cases:
        with pytest.raises(UserError, match=re.escape(message)) as err:
            loading.load(path)
        assert "\n" not in str(err.value)


def test_bad_dtype_and_device(llada_dir):
    with pytest.raises(UserError, match="unknown dtype"):
        loading.load(llada_dir, dtype="fp8")
    with pytest.raises(UserError, match="unknown device"):
        loading.load(llada_dir, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA device"):
            loading.load(llada_dir, device="cuda")


def test_published_files_ship_inside_the_package():
    """tiny_random (and tiny_blockdiff) read the published configs and tokenizer files from the
    installed package, not from a source checkout's tests/ (CI runs on a regular install)."""
    import fastdllm
    from fastdllm.testing.tiny_random import FIXTURES

    assert FIXTURES.is_relative_to(Path(fastdllm.__file__).parent)
    for name in ("Dream-v0-Instruct-7B/vocab.json", "Dream-v0-Instruct-7B/merges.txt", "LLaDA-8B-Instruct/config.json"):
        assert (FIXTURES / name).is_file(), name
