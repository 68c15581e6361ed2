"""The GGUF writer for tests: a tiny checkpoint folder written as llama.cpp's converter writes it
(metadata keys, tensor names, q/k rows permuted where it permutes them, --outtype F32 / F16 / BF16 /
Q8_0): LLaDA (write_gguf), and the Qwen-layout families on one vocabulary and one tensor path
(write_qwen_gguf: Dream, RND1; write_llada_moe_gguf); and the same folder through the gguf
package's quantize -> dequantize, and one weight as the package dequantizes the file's quantization of it
(packages_dequantization, over the tiny LLaDA's block LINEARS: test_gguf_int4.py, test_gguf_fallbacks.py).
Used by tests/gguf/test_gguf*.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")


# --- the writer: llama.cpp's convert_hf_to_gguf.py (conversion/llada.py, base.py) as docs/specs/gguf.md says ---

def converter_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Per head, rows in halves (i, i + hd/2) -> interleaved pairs (2i, 2i+1): llama.cpp's rope order."""
    hd = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        head = w[h * hd:(h + 1) * hd]
        out[h * hd:(h + 1) * hd][0::2] = head[:hd // 2]
        out[h * hd:(h + 1) * hd][1::2] = head[hd // 2:]
    return out


GGUF_NAMES = {"model.transformer.wte.weight": "token_embd.weight", "model.transformer.ln_f.weight": "output_norm.weight",
              "model.transformer.ff_out.weight": "output.weight"}
BLOCK_NAMES = {"attn_norm": "attn_norm", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
               "attn_out": "attn_output", "ff_norm": "ffn_norm", "ff_proj": "ffn_gate", "up_proj": "ffn_up",
               "ff_out": "ffn_down"}


def folder_weights(src: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted(src.glob("*.safetensors")):
        weights.update(load_file(shard))
    return weights


def write_gguf(src: Path, out: Path, outtype: str = "F32", arch: str = "llada", *, skip_keys=(),
               extra_tensor: tuple[str, str] | None = None, hook=None) -> Path:
    """`outtype`: F32, BF16, Q8_0, ... for the 2-D weights, or a function of the GGUF name giving each
    one's type (llama-quantize's mixes); norms stay F32 (the converter's rule)."""
    config = json.loads((src / "config.json").read_text())
    tok_config = json.loads((src / "tokenizer_config.json").read_text())
    tok_json = json.loads((src / "tokenizer.json").read_text())
    w = gguf.GGUFWriter(out, arch)
    hd = config["d_model"] // config["n_heads"]
    keys = [("block_count", w.add_block_count, config["n_layers"]),
            ("context_length", w.add_context_length, config["max_sequence_length"]),
            ("embedding_length", w.add_embedding_length, config["d_model"]),
            ("feed_forward_length", w.add_feed_forward_length, config["mlp_hidden_size"]),
            ("attention.head_count", w.add_head_count, config["n_heads"]),
            ("attention.head_count_kv", w.add_head_count_kv, config["n_kv_heads"]),
            ("rope.freq_base", w.add_rope_freq_base, config["rope_theta"]),
            ("attention.layer_norm_rms_epsilon", w.add_layer_norm_rms_eps, config["rms_norm_eps"]),
            ("vocab_size", w.add_vocab_size, config["vocab_size"]),
            ("rope.dimension_count", w.add_rope_dimension_count, hd),
            ("tokenizer.ggml.mask_token_id", w.add_mask_token_id, config["mask_token_id"])]
    for key, add, value in keys:
        if key not in skip_keys:
            add(value)
    w.add_causal_attention(False)
    w.add_diffusion_shift_logits(False)
    file_types = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q8_0": "MOSTLY_Q8_0"}
    w.add_file_type(gguf.LlamaFileType[file_types.get(outtype if isinstance(outtype, str) else "", "ALL_F32")])
    # the vocabulary (_set_vocab_gpt2): every id below vocab_size, added special tokens as CONTROL
    vocab = tok_json["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    by_id = {i: t for t, i in {**vocab, **added}.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(config["vocab_size"])]
    types = [gguf.TokenType.CONTROL if t in added else gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED
             for i, t in enumerate(tokens)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    if "tokenizer.ggml.tokens" not in skip_keys:
        w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges_of(src))
    w.add_bos_token_id(added[tok_config["bos_token"]])
    w.add_eos_token_id(added[tok_config["eos_token"]])
    w.add_pad_token_id(added[tok_config["pad_token"]])
    w.add_add_bos_token(True)
    w.add_chat_template(tok_config["chat_template"])
    for name, tensor in folder_weights(src).items():
        data = tensor.float().numpy()
        if m := re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.weight", name):
            new = f"blk.{m.group(1)}.{BLOCK_NAMES[m.group(2)]}.weight"
            if m.group(2) in ("q_proj", "k_proj"):
                data = converter_permute(data, config["n_heads" if m.group(2) == "q_proj" else "n_kv_heads"])
        else:
            new = GGUF_NAMES[name]
        kind = outtype(new) if callable(outtype) else outtype          # a mix (Q4_K_M): a type per tensor
        add_tensor(w, new, data, "F32" if data.ndim == 1 or new.endswith("_norm.weight") else kind)
    if extra_tensor:
        extra(w, *extra_tensor)
    return finish(w, out, hook)


def add_tensor(w, name: str, data: np.ndarray, qtype: str) -> None:
    """The gguf package's quantizer; for the k-quants, which it only reads, checkpoints/gguf_kquants.py."""
    from fastdllm.checkpoints.gguf_kquants import quantize_kquant

    kind = gguf.GGMLQuantizationType[qtype]
    raw = (data.astype(np.float32) if qtype == "F32" else quantize_kquant(data, qtype) if qtype.endswith("_K")
           else gguf.quants.quantize(data, kind))
    w.add_tensor(name, raw, raw_dtype=kind)


def extra(w, name: str, qtype: str) -> None:
    """A tensor the converter would not write for LLaDA: 256 zeros (one k-quant block) of `qtype`."""
    kind = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    w.add_tensor(name, np.zeros((1, 256 // block * size), np.uint8) if qtype != "F32" else np.zeros(256, np.float32),
                 raw_dtype=kind)


def assert_read_as_round_trip(src: Path, path: Path, qtype: str) -> None:
    """The GGUF file `path` (src written as `qtype`) reads back as the gguf package's quantize ->
    dequantize of each 2-D weight (really changed by it) and each norm as it was, fp32."""
    from fastdllm.checkpoints.gguf_file import state_dict
    from fastdllm.checkpoints.locate import resolve_model_dir

    config = json.loads((resolve_model_dir(str(path)) / "config.json").read_text())
    got = state_dict(path, config, torch.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    for name, tensor in folder_weights(src).items():
        if tensor.ndim == 1:
            assert torch.equal(got[name], tensor.float()), name
        else:
            want = gguf.quants.dequantize(gguf.quants.quantize(tensor.float().numpy(), kind), kind)
            assert torch.equal(got[name], torch.from_numpy(want)), name
            assert not torch.equal(got[name], tensor.float()), name          # really quantized


def round_tripped(src: Path, out: Path, qtype: str, keep: tuple[str, ...] = ()) -> Path:
    """The folder with its 2-D weights through the gguf package's quantize -> dequantize (fp32 on disk);
    `keep`: name suffixes the converter leaves F32 (an MoE router)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    kind = gguf.GGMLQuantizationType[qtype]
    for shard in sorted(out.glob("*.safetensors")):
        weights = {n: (torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(t.float().numpy(), kind), kind))
                       if t.ndim == 2 and not n.endswith(keep) else t.float()) for n, t in load_file(shard).items()}
        save_file(weights, shard, metadata={"format": "pt"})
    return out


# --- the Qwen-layout families: Dream (conversion/dream.py), RND1 (conversion/qwen.py RND1Model) and
# LLaDA-MoE (conversion/llada.py LLaDAMoEModel), as docs/specs/gguf.md 9 and 12 say: TextModel's keys and
# the family's own, get_vocab_base's vocabulary, Qwen2/Qwen3-MoE tensor names, no permutation ---

# the published names -> llama.cpp's (gguf-py tensor_mapping.py rows of the qwen2, qwen3moe and
# llada-moe architectures), written here independently of fastdllm's table
QWEN_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
QWEN_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
CONVERTER_MASK = 156895            # LLaDAMoEModel.set_gguf_parameters' add_mask_token_id, whatever the vocabulary


def write_qwen_gguf(src: Path, out: Path, arch: str, outtype: str = "F32", *, shift=None, hook=None) -> Path:
    """Dream or RND1 (`arch`): TextModel.set_gguf_parameters' keys, the family's own (RND1: Qwen2MoeModel's,
    head_dim as key/value length), the vocabulary, the tensors; diffusion.shift_logits only when `shift` is given."""
    from fastdllm.checkpoints.specials import load_tokenizer

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
    if arch == "rnd1":
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
    add_vocab(w, src, tok, c["vocab_size"], "qwen2")
    vocab = tok.get_vocab()
    for setter, token in ((w.add_bos_token_id, tok.bos_token), (w.add_eos_token_id, tok.eos_token),
                          (w.add_pad_token_id, tok.pad_token)):
        if token is not None:
            setter(vocab[token])
    if tok.chat_template:
        w.add_chat_template(tok.chat_template)
    add_qwen_tensors(w, src, outtype)
    return finish(w, out, hook)


def write_llada_moe_gguf(src: Path, out: Path, outtype: str = "F32", *, mask_from_tokenizer: bool = True,
                         hook=None) -> Path:
    """TextModel.set_gguf_parameters' keys (those the published config.json has), LLaDAMoEModel's own,
    the vocabulary, SpecialVocab's ids and flags, then the tensors."""
    from fastdllm.checkpoints.specials import load_tokenizer

    c = json.loads((src / "config.json").read_text())
    tok_config = json.loads((src / "tokenizer_config.json").read_text())
    tok = load_tokenizer(src)
    w = gguf.GGUFWriter(out, "llada-moe")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if "dense_intermediate_size" in c:             # find_hparam's first match of the feed-forward keys
        w.add_feed_forward_length(c["dense_intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    if "rms_norm_eps" in c:                        # the published config has none: no key
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_expert_feed_forward_length(c["expert_intermediate_size"])
    w.add_mask_token_id(CONVERTER_MASK)
    w.add_causal_attention(False)
    w.add_diffusion_shift_logits(False)
    add_vocab(w, src, tok, c["vocab_size"], "gpt-2")
    # SpecialVocab (after set_gguf_parameters: its mask id, where the tokenizer names one, overwrites 156895)
    specials = [("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)]
    for kind, setter in specials + ([("mask", w.add_mask_token_id)] if mask_from_tokenizer else []):
        if (token := tok_config.get(f"{kind}_token")) is not None:
            setter(tok.convert_tokens_to_ids(token))
    w.add_add_bos_token(bool(tok_config.get("add_bos_token")))
    w.add_add_eos_token(bool(tok_config.get("add_eos_token")))
    w.add_chat_template(tok_config["chat_template"])
    add_qwen_tensors(w, src, outtype)
    return finish(w, out, hook)


def add_vocab(w, src: Path, tok, vocab_size: int, pre: str) -> None:
    """get_vocab_base: every id below vocab_size, holes [PADi] UNUSED, added tokens CONTROL (special) or
    USER_DEFINED; the BPE merges as SpecialVocab loads them."""
    by_id = {i: t for t, i in tok.get_vocab().items()}
    added = tok.get_added_vocab()
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED if i not in by_id else
             (gguf.TokenType.CONTROL if tok.added_tokens_decoder[i].special else gguf.TokenType.USER_DEFINED)
             if by_id[i] in added else gguf.TokenType.NORMAL for i in range(vocab_size)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges_of(src))


def merges_of(src: Path) -> list[str]:
    """SpecialVocab's merges: tokenizer.json's, else merges.txt's (its "#version" line left out)."""
    if (src / "tokenizer.json").exists():
        merges = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
        return [m if isinstance(m, str) else " ".join(m) for m in merges]
    return [m for m in (src / "merges.txt").read_text(encoding="utf-8").splitlines() if m and not m.startswith("#")]


def add_qwen_tensors(w, src: Path, outtype: str) -> None:
    """The folder's tensors under llama.cpp's names: experts stacked per layer (E, out, in) as Qwen2MoeModel
    does, after the others; 1-D tensors and the router F32 (prepare_tensors keeps FFN_GATE_INP F32)."""
    experts = {}
    for name, tensor in folder_weights(src).items():
        data = tensor.float().numpy()
        if m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)_proj\.weight", name):
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = data
            continue
        if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name):
            new = f"blk.{m.group(1)}.{QWEN_BLOCK[m.group(2)]}.{m.group(3)}"
        else:
            new = QWEN_GLOBAL[name]
        router = new.endswith("ffn_gate_inp.weight")
        add_tensor(w, new, data, "F32" if data.ndim == 1 or router else outtype)
    for (layer, which), per in sorted(experts.items()):       # torch.stack over the experts, in order
        add_tensor(w, f"blk.{layer}.ffn_{which}_exps.weight", np.stack([per[e] for e in sorted(per)]), outtype)


def finish(w, out: Path, hook=None) -> Path:
    """`hook(w)` (a test's last change to the file), then the header, keys and tensors written."""
    if hook:
        hook(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# --- one weight as the gguf package dequantizes the file's quantization of it ---

LINEARS = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")    # the tiny LLaDA's block linears


def packages_dequantization(src, name: str, qtype: str, heads: int | None) -> torch.Tensor:
    """The weight as the file holds it (converter's row order, the type's quantizer), dequantized by the
    gguf package and put back in the published row order: what fastdllm quantizes."""
    from fastdllm.checkpoints.gguf_kquants import quantize_kquant

    w = folder_weights(src)[name].float().numpy()
    on_disk = converter_permute(w, heads) if heads else w
    kind = gguf.GGMLQuantizationType[qtype]
    raw = quantize_kquant(on_disk, qtype) if qtype.endswith("_K") else gguf.quants.quantize(on_disk, kind)
    deq = gguf.quants.dequantize(raw, kind)
    if heads:
        deq = deq.reshape(heads, -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
    return torch.from_numpy(np.ascontiguousarray(deq))
