"""GGUF files of the Qwen-layout families (docs/specs/gguf.md section 9): tiny Dream and RND1 checkpoints
written as llama.cpp's converter writes them (tests/gguf/gguf_writer.py write_qwen_gguf: TextModel's keys,
Qwen2/Qwen3-MoE tensor names, experts stacked into 3-D tensors, the router F32, no permutation),
then decoded by fastdllm in float64: the same tokens and NFE as the safetensors folder at F32, and
as the gguf package's quantize -> dequantize of the same weights at Q8_0."""

from __future__ import annotations

import json

import pytest
import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir

from gguf_decode import QWEN_PROMPTS, decode_qwen
from one_line import one_line_refusal
from gguf_writer import folder_weights, round_tripped, write_qwen_gguf

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def rnd1_dir(tiny):
    return tiny("rnd1", dtype=torch.float32)


@pytest.fixture(scope="module")
def family_dirs(dream_dir, rnd1_dir):
    return {"dream": dream_dir, "rnd1": rnd1_dir}


@pytest.mark.parametrize("arch", ["dream", "rnd1"])
def test_f32_gguf_decodes_as_the_folder(family_dirs, tmp_path, arch, one_thread):
    src = family_dirs[arch]
    path = write_qwen_gguf(src, tmp_path / f"tiny-{arch}-F32.gguf", arch)
    lm, want = loading.load(resolve_model_dir(str(path)), dtype="fp64"), loading.load(src, dtype="fp64")
    assert lm.family == want.family and lm.specials.mask == want.specials.mask
    # the converter's SpecialVocab reads eos from tokenizer_config.json before config.json: for RND1
    # that is <|endoftext|> where its config.json says <|im_end|>; the file's id is the stop (llama.cpp's too)
    assert lm.specials.stops == ((want.tokenizer.eos_token_id,) if arch == "rnd1" else want.specials.stops)
    for p in QWEN_PROMPTS:
        assert lm.encode(p, chat=False) == want.encode(p, chat=False)
        if want.has_chat_template:
            assert lm.encode(p, chat=True) == want.encode(p, chat=True)
    got, ref = decode_qwen(lm), decode_qwen(want)
    assert got == ref                                 # tokens and NFE, exactly
    assert len({tuple(c) for c, _ in ref}) == len(QWEN_PROMPTS)


@pytest.mark.parametrize("arch", ["dream", "rnd1"])
def test_gguf_weights_equal_the_folder(family_dirs, tmp_path, arch):
    from fastdllm.checkpoints.gguf_file import state_dict

    path = write_qwen_gguf(family_dirs[arch], tmp_path / f"{arch}.gguf", arch)
    config = json.loads((resolve_model_dir(str(path)) / "config.json").read_text())
    got, want = state_dict(path, config, torch.float32), folder_weights(family_dirs[arch])
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor.float()), name


@pytest.mark.parametrize("arch", ["dream", "rnd1"])
def test_q8_0_decodes_as_the_round_tripped_weights(family_dirs, tmp_path, arch, one_thread):
    path = write_qwen_gguf(family_dirs[arch], tmp_path / f"tiny-{arch}-Q8_0.gguf", arch, "Q8_0")
    lm = loading.load(resolve_model_dir(str(path)), dtype="fp64")
    router = ("mlp.gate.weight",)                         # RND1's router: F32 in the file, as the converter keeps it
    twin = loading.load(round_tripped(family_dirs[arch], tmp_path / "twin", "Q8_0", keep=router), dtype="fp64")
    assert decode_qwen(lm) == decode_qwen(twin)


def test_a_shift_the_family_does_not_have_is_refused(dream_dir, tmp_path):
    path = write_qwen_gguf(dream_dir, tmp_path / "noshift.gguf", "dream", shift=False)
    one_line_refusal(lambda: resolve_model_dir(str(path)), "noshift.gguf: diffusion.shift_logits False; dream predicts "
                                                           "from the previous position")
