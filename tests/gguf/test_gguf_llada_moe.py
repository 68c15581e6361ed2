"""GGUF files of LLaDA-MoE (docs/specs/gguf.md section 12): the tiny LLaDA-MoE checkpoint in its published
layout written as llama.cpp's converter writes it (conversion/llada.py LLaDAMoEModel: TextModel's keys,
the published names mapped by gguf-py's tables, experts stacked into 3-D tensors, no permutation,
the router F32), then decoded by fastdllm in float64: the same tokens and NFE as the safetensors
folder at F32, and as the gguf package's quantize -> dequantize of the same weights at Q8_0."""

from __future__ import annotations

import json

import pytest
import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.models.cpu_quant import Int8Linear
from fastdllm.testing.tiny_moe import EOS_ID, MASK_ID

from one_line import one_line_refusal
from gguf_writer import CONVERTER_MASK, folder_weights, round_tripped, write_llada_moe_gguf

gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.fast

CFG = DecodeConfig(gen_len=16, block_len=8, cache="dual", rule="threshold", threshold=0.7, early_stop=False)
PROMPTS = ["Hi.", "What is 2 + 2?"]
ROUTER = ("mlp.gate.weight",)           # the converter keeps FFN_GATE_INP in F32


@pytest.fixture(scope="module")
def moe_dir(tiny):
    return tiny("llada_moe", dtype=torch.float32)


@pytest.fixture(scope="module")
def f32_file(moe_dir, tmp_path_factory):
    return write_llada_moe_gguf(moe_dir, tmp_path_factory.mktemp("gguf") / "tiny-llada-moe-F32.gguf")


def decode(lm) -> list:
    return [(r.canvas[0].tolist(), r.nfe) for r in (run(lm.decoder, [lm.encode(p, chat=True)], CFG) for p in PROMPTS)]


def test_f32_gguf_decodes_as_the_folder(moe_dir, f32_file, one_thread):
    folder = resolve_model_dir(str(f32_file))
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LLaDAMoEModelLM"] and config["moe_layer_freq"] == [1, 1]
    assert "rms_norm_eps" not in config             # no key in the file: the family's default, as for the folder
    lm, want = loading.load(folder, dtype="fp64"), loading.load(moe_dir, dtype="fp64")
    assert type(lm.model) is type(want.model) and lm.family == want.family
    # SpecialVocab's <|mask|> from the tokenizer overwrites the converter's 156895
    assert lm.specials == want.specials and lm.specials.mask == MASK_ID and lm.specials.stops[0] == EOS_ID
    for p in PROMPTS:
        assert lm.encode(p, chat=False) == want.encode(p, chat=False)
        assert lm.encode(p, chat=True) == want.encode(p, chat=True)
    got, ref = decode(lm), decode(want)
    assert got == ref                                 # tokens and NFE, exactly
    assert len({tuple(c) for c, _ in ref}) == len(PROMPTS)


def test_gguf_weights_equal_the_folder(moe_dir, f32_file):
    from fastdllm.checkpoints.gguf_file import state_dict

    config = json.loads((resolve_model_dir(str(f32_file)) / "config.json").read_text())
    got, want = state_dict(f32_file, config, torch.float32), folder_weights(moe_dir)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor.float()), name


def test_q8_0_decodes_as_the_round_tripped_weights(moe_dir, tmp_path, one_thread):
    path = write_llada_moe_gguf(moe_dir, tmp_path / "tiny-llada-moe-Q8_0.gguf", "Q8_0")
    lm = loading.load(resolve_model_dir(str(path)), dtype="fp64")
    twin = loading.load(round_tripped(moe_dir, tmp_path / "twin", "Q8_0", keep=ROUTER), dtype="fp64")
    assert decode(lm) == decode(twin)


def test_q8_0_experts_kept_as_int8_rows(moe_dir, tmp_path):
    """4 attention linears + 8 experts x 3 per layer; the router stays float."""
    path = write_llada_moe_gguf(moe_dir, tmp_path / "tiny-llada-moe-Q8_0.gguf", "Q8_0")
    lm = loading.load(resolve_model_dir(str(path)), dtype="bf16", quantize="int8")
    ref = loading.load(resolve_model_dir(str(path)), dtype="fp32")
    assert lm.info["gguf_int8"].startswith("56 block linears from Q8_0")
    routers = [m for n, m in lm.model.named_modules() if n.endswith("mlp.gate")]
    assert routers and all(not isinstance(m, Int8Linear) for m in routers)
    ids = torch.tensor([lm.encode("Hi there", chat=False) + [lm.specials.mask] * 4])
    with torch.no_grad():
        got, want = lm.model(ids).logits.float(), ref.model(ids).logits
    assert float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()) < 0.1


def test_refusals_are_one_line(moe_dir, tmp_path):
    no_mask = write_llada_moe_gguf(moe_dir, tmp_path / "nomask.gguf", mask_from_tokenizer=False)
    one_line_refusal(lambda: resolve_model_dir(str(no_mask)),
                     f"nomask.gguf: mask token id {CONVERTER_MASK} is outside its 4224 token embeddings")
    bias = write_llada_moe_gguf(moe_dir, tmp_path / "bias.gguf",
                                hook=lambda w: w.add_tensor("blk.0.attn_q.bias", torch.zeros(64).numpy()))
    one_line_refusal(lambda: resolve_model_dir(str(bias)), "tensor blk.0.attn_q.bias has no place in fastdllm's llada-moe")
    sigmoid = write_llada_moe_gguf(moe_dir, tmp_path / "sigmoid.gguf",
                                   hook=lambda w: w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID))
    one_line_refusal(lambda: resolve_model_dir(str(sigmoid)),
                     "sigmoid.gguf: llada-moe.expert_gating_func 2 asks for another router score than softmax")
