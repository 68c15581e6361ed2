"""GGUF files of the Qwen-layout families (docs/specs/gguf.md section 9): tiny Dream and RND1 checkpoints
written as llama.cpp's converter writes them (conversion/dream.py, conversion/qwen.py RND1Model:
TextModel's keys, Qwen2/Qwen3-MoE tensor names, experts stacked into 3-D tensors, no permutation),
then decoded by fastdllm in float64: the same tokens and NFE as the safetensors folder at F32, and
as the gguf package's quantize -> dequantize of the same weights at Q8_0."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.checkpoints.specials import load_tokenizer
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run

from one_line import one_line_refusal
from gguf_writer import add_tensor as add, folder_weights, round_tripped

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.fast

CFG = DecodeConfig(gen_len=16, block_len=8, cache="dual", rule="threshold", threshold=0.7, early_stop=False)
PROMPTS = ["Hi.", "What is 2 + 2?"]

# the published names -> llama.cpp's (gguf-py tensor_mapping.py, qwen2 / qwen3moe rows), written
# here independently of fastdllm's table
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
         "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
         "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight"}


def write_qwen_gguf(src: Path, out: Path, arch: str, outtype: str = "F32", *, shift=None) -> Path:
    """TextModel.set_gguf_parameters' keys, the family's own, _set_vocab_gpt2's vocabulary, tensors."""
    c = json.loads((src / "config.json").read_text())
    tok = load_tokenizer(src)
    w = gguf.GGUFWriter(out, arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if arch == "rnd1":              # Qwen2MoeModel's keys, head_dim as key/value length
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_causal_attention(False)
    w.add_mask_token_id(c["mask_token_id"])
    if shift is not None:
        w.add_diffusion_shift_logits(shift)
    # DreamModel.get_vocab_base: every id below vocab_size, added special ones CONTROL, holes UNUSED
    vocab, added = tok.get_vocab(), tok.get_added_vocab()
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(c["vocab_size"]):
        if i not in by_id:
            tokens.append(f"[PAD{i}]"), types.append(gguf.TokenType.UNUSED)
        elif by_id[i] in added:
            special = tok.added_tokens_decoder[i].special
            tokens.append(by_id[i]), types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i]), types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    merges = [m for m in (src / "merges.txt").read_text(encoding="utf-8").splitlines() if m and not m.startswith("#")]
    w.add_token_merges(merges)
    for setter, token in ((w.add_bos_token_id, tok.bos_token), (w.add_eos_token_id, tok.eos_token),
                       (w.add_pad_token_id, tok.pad_token)):
        if token is not None:
            setter(vocab[token])
    if tok.chat_template:
        w.add_chat_template(tok.chat_template)
    weights = folder_weights(src)
    experts = {}
    for name, tensor in weights.items():
        data = tensor.float().numpy()
        if m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)_proj\.weight", name):
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = data
            continue
        if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name):
            new = f"blk.{m.group(1)}.{BLOCK[m.group(2)]}"
        else:
            new = GLOBAL[name]
        add(w, new, data, "F32" if data.ndim == 1 else outtype)
    for (layer, which), per in sorted(experts.items()):       # Qwen2MoeModel: torch.stack over experts
        add(w, f"blk.{layer}.ffn_{which}_exps.weight", np.stack([per[e] for e in sorted(per)]), outtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out




@pytest.fixture(scope="module")
def rnd1_dir(tmp_path_factory):
    from fastdllm.testing.tiny_rnd1 import write_rnd1

    return write_rnd1(tmp_path_factory.mktemp("ckpt") / "tiny-rnd1", dtype=torch.float32)


@pytest.fixture(scope="module")
def family_dirs(dream_dir, rnd1_dir):
    return {"dream": dream_dir, "rnd1": rnd1_dir}


def decode(lm) -> list:
    chat = lm.has_chat_template
    return [(r.canvas[0].tolist(), r.nfe) for r in (run(lm.decoder, [lm.encode(p, chat=chat)], CFG) for p in PROMPTS)]


@pytest.mark.parametrize("arch", ["dream", "rnd1"])
def test_f32_gguf_decodes_as_the_folder(family_dirs, tmp_path, arch, one_thread):
    src = family_dirs[arch]
    path = write_qwen_gguf(src, tmp_path / f"tiny-{arch}-F32.gguf", arch)
    lm, want = loading.load(resolve_model_dir(str(path)), dtype="fp64"), loading.load(src, dtype="fp64")
    assert lm.family == want.family and lm.specials.mask == want.specials.mask
    # the converter's SpecialVocab reads eos from tokenizer_config.json before config.json: for RND1
    # that is <|endoftext|> where its config.json says <|im_end|>; the file's id is the stop (llama.cpp's too)
    assert lm.specials.stops == ((want.tokenizer.eos_token_id,) if arch == "rnd1" else want.specials.stops)
    for p in PROMPTS:
        assert lm.encode(p, chat=False) == want.encode(p, chat=False)
        if want.has_chat_template:
            assert lm.encode(p, chat=True) == want.encode(p, chat=True)
    got, ref = decode(lm), decode(want)
    assert got == ref                                 # tokens and NFE, exactly
    assert len({tuple(c) for c, _ in ref}) == len(PROMPTS)


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
    twin = loading.load(round_tripped(family_dirs[arch], tmp_path / "twin", "Q8_0"), dtype="fp64")
    assert decode(lm) == decode(twin)


def test_a_shift_the_family_does_not_have_is_refused(dream_dir, tmp_path):
    path = write_qwen_gguf(dream_dir, tmp_path / "noshift.gguf", "dream", shift=False)
    one_line_refusal(lambda: resolve_model_dir(str(path)), "noshift.gguf: diffusion.shift_logits False; dream predicts "
                                                           "from the previous position")
