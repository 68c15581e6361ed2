"""Random-weight checkpoints of the two MoE diffusion families in their published layouts:
LLaDA2.x-mini (`llada2_moe`, docs/specs/llada2-moe.md) and LLaDA-MoE-7B-A1B (`llada` + `LLaDAMoEModelLM`,
docs/specs/llada-moe.md). Written tensor by tensor with safetensors (no fastdllm model class): config.json
= the reconstructed published one (fastdllm/checkpoints/published/<checkpoint>/config.json, every key, published
order) with the sizes shrunk, the published tensor names, sharded with `model.safetensors.index.json`.

Tokenizer: the real Ling tokenizer (157k tokens) is not available here, so the fixtures reuse the
built-in tiny-code byte-level BPE (4096 tokens, ids 0..4095; its own six special tokens renamed to
unused placeholders) and append the Ling special tokens after it, eos and mask three ids apart as in
the real vocabulary (156892 / 156895). config `vocab_size` is padded past the tokenizer to a multiple
of 128, as the published 157184 is; the padding rows and the mask row of lm_head are scaled down, so
that neither is ever the argmax (docs/specs/llada2-moe.md §8). The mask id is found through the tokenizer's
`mask_token` (no config key names it; docs Q6 order: config, tokenizer, 156895).

Weights: normal(0, init_std) for matrices and biases, 1 + N(0, 0.1^2) for every RMSNorm weight (q/k
norms too), lm_head times `logit_scale`; the router's expert bias uniform in +-expert_bias_range so
that it flips selections and, for llada2_moe, which groups are kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoints.published import FOLDER as PUBLISHED
from .files import DTYPE_NAMES, layer_shards, normal_makers, write_json, write_safetensors

# model_type -> the checkpoint whose config.json is kept under PUBLISHED (fastdllm/checkpoints/published/README.md)
PUBLISHED_DIRS = {"llada2_moe": "LLaDA2.1-mini", "llada_moe": "LLaDA-MoE-7B-A1B-Instruct",
                  "sdar_moe": "SDAR-30B-A3B-Chat"}            # its writer: tiny_sdar_moe.py
BASE_TOKENIZER = PUBLISHED.parent / "builtin" / "tiny-code" / "tokenizer.json"

BASE_VOCAB = 4096                                   # tiny-code's BPE
# Ling special tokens in the fixtures, ids from BASE_VOCAB on (the real ids of bos, the role markup and
# <|role_end|> are not verified; eos = pad and mask keep their real distance of 3)
LING_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<role>", "</role>", "<|mask|>", "<|role_end|>"]
BOS_ID, EOS_ID, ROLE_ID, ROLE_CLOSE_ID, MASK_ID, ROLE_END_ID = range(BASE_VOCAB, BASE_VOCAB + len(LING_SPECIALS))
TOKENIZER_LEN = BASE_VOCAB + len(LING_SPECIALS)     # 4102
VOCAB_SIZE = -(-TOKENIZER_LEN // 128) * 128         # 4224: padded like the published 157184 (= 1228 * 128)

# Ling-2.0 chat structure (docs/specs/llada2-moe.md §2.4): always a system turn ending in the hard-coded
# thinking switch, <role>X</role>content<|role_end|> turns, earlier <think> parts stripped, generation
# prompt <role>ASSISTANT</role>, no bos. NOT the verified LLaDA2 text (the tokenizer files were not
# readable): written from the spec's description; the tools preamble is left out and consecutive
# tool results are not merged into one OBSERVATION turn.
LLADA2_CHAT_TEMPLATE = (
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{{- '<role>SYSTEM</role>' -}}"
    "{%- if has_system -%}{{- messages[0]['content'] + '\\n' -}}{%- endif -%}"
    "{{- 'detailed thinking off<|role_end|>' -}}"
    "{%- for message in messages -%}"
    "{%- if loop.first and has_system -%}"
    "{%- elif message['role'] == 'user' -%}{{- '<role>HUMAN</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- elif message['role'] == 'system' -%}{{- '<role>SYSTEM</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<role>ASSISTANT</role>' + content + '<|role_end|>' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<role>OBSERVATION</role>\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|role_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}")

# LLaDA-MoE's template was not read (docs/specs/llada-moe.md §2.2). Decision: the same Ling turn markup,
# but no forced system turn and no thinking switch (a Ling-2.0 feature; LLaDA-MoE predates it).
LLADA_MOE_CHAT_TEMPLATE = (
    "{%- set roles = {'system': 'SYSTEM', 'user': 'HUMAN', 'assistant': 'ASSISTANT', 'tool': 'OBSERVATION'} -%}"
    "{%- for message in messages -%}"
    "{{- '<role>' + roles[message['role']] + '</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}")

def write_llada2_moe(out: Path, *, seed=0, init_std=0.3, logit_scale=3.0, expert_bias_range=0.3,
                     expert_bias_dtype=torch.float32, sharded=True, dtype=torch.bfloat16, drop_keys=(),
                     **config) -> Path:
    """LLaDA2.1-mini's layout shrunk to the docs §8 fixture; `config` overrides config.json keys
    (e.g. use_bias=True, use_qkv_bias=True, num_shared_experts=None, first_k_dense_replace=0,
    use_qk_norm=False, mask_token_id=...), `drop_keys` removes keys (e.g. ("dtype",) with
    torch_dtype=...). The expert bias is stored in float32 by default (its published dtype is not
    verified, docs Q8)."""
    c = _config("llada2_moe", config, drop_keys, {
        "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 24, "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8, "n_group": 4,
        "topk_group": 2, "num_experts_per_tok": 3, "num_shared_experts": 1, "first_k_dense_replace": 1,
        "vocab_size": VOCAB_SIZE, "pad_token_id": EOS_ID})
    if "rotary_dim" not in config:                                # ignored by H1; kept consistent
        c["rotary_dim"] = int(c["head_dim"] * c["partial_rotary_factor"])
    if "dtype" in c:
        c["dtype"] = DTYPE_NAMES[dtype]
    if "torch_dtype" in c:
        c["torch_dtype"] = DTYPE_NAMES[dtype]
    g = torch.Generator().manual_seed(seed)
    mat, norm = normal_makers(g, init_std)
    d, H, KV, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, S = c["num_experts"], c["moe_intermediate_size"], c["num_shared_experts"]
    w = {"model.word_embeddings.weight": mat(c["vocab_size"], d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "attention.query_key_value.weight"] = mat((H + 2 * KV) * hd, d)   # rows: q heads | k heads | v heads
        if c["use_qkv_bias"]:
            w[p + "attention.query_key_value.bias"] = mat((H + 2 * KV) * hd)
        if c.get("use_qk_norm", True):                                           # absent key = H1's default (true)
            w[p + "attention.query_layernorm.weight"], w[p + "attention.key_layernorm.weight"] = norm(hd), norm(hd)
        w[p + "attention.dense.weight"] = mat(d, H * hd)
        if c["use_bias"]:
            w[p + "attention.dense.bias"] = mat(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if i < c["first_k_dense_replace"]:
            w.update(swiglu(p + "mlp.", mat, d, c["intermediate_size"]))
            continue
        w[p + "mlp.gate.weight"] = mat(E, d)
        w[p + "mlp.gate.expert_bias"] = _uniform(g, E, expert_bias_range).to(expert_bias_dtype)
        for j in range(E):
            w.update(swiglu(p + f"mlp.experts.{j}.", mat, d, I))
        if S:                                                                    # None (or 0): no shared expert
            w.update(swiglu(p + "mlp.shared_experts.", mat, d, S * I))
    w["model.norm.weight"] = norm(d)
    w["lm_head.weight"] = _head(mat(c["vocab_size"], d), logit_scale)
    return _write(out, c, w, dtype, sharded, LLADA2_CHAT_TEMPLATE)


def write_llada2_2(out: Path, *, expert_capacity=4, block_size=32, **kwargs) -> Path:
    """LLaDA2.2's format as far as it is known (docs/specs/llada2-2.md §1): LLaDA2.1-mini's config.json
    plus `expert_capacity` and `block_size` (block routing); 4 of the fixture's 8 experts per block."""
    return write_llada2_moe(out, expert_capacity=expert_capacity, block_size=block_size, **kwargs)


def write_llada_moe(out: Path, *, seed=0, init_std=0.3, logit_scale=3.0, expert_bias_range=0.05,
                    expert_bias_dtype=torch.float32, sharded=True, dtype=torch.bfloat16, drop_keys=(),
                    **config) -> Path:
    """LLaDA-MoE-7B-A1B-Instruct's layout shrunk to the docs §8 fixture; `config` overrides keys (second
    fixture: num_key_value_heads=2, shared_expert_intermediate_size=48, moe_layer_freq=[0, 1],
    moe_router_enable_expert_bias=True). `moe_layer_freq` follows `num_hidden_layers` unless given."""
    c = _config("llada_moe", config, drop_keys, {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 3, "expert_intermediate_size": 32, "dense_intermediate_size": 96,
        "vocab_size": VOCAB_SIZE, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID})
    if "moe_layer_freq" not in config:
        c["moe_layer_freq"] = [1] * c["num_hidden_layers"]        # one entry per layer, 1 = MoE
    if "torch_dtype" in c:
        c["torch_dtype"] = DTYPE_NAMES[dtype]
    g = torch.Generator().manual_seed(seed)
    mat, norm = normal_makers(g, init_std)
    d, H, KV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, E = d // H, c["num_experts"]                              # no head_dim key: hidden / heads
    bias = c["attention_bias"]
    w = {"model.embed_tokens.weight": mat(c["vocab_size"], d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        for name, rows, cols in (("q", H * hd, d), ("k", KV * hd, d), ("v", KV * hd, d), ("o", d, H * hd)):
            w[p + f"self_attn.{name}_proj.weight"] = mat(rows, cols)
            if bias:
                w[p + f"self_attn.{name}_proj.bias"] = mat(rows)
        if c["qk_layernorm"]:
            w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = norm(hd), norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if c["moe_layer_freq"][i]:
            w[p + "mlp.gate.weight"] = mat(E, d)
            if c["moe_router_enable_expert_bias"]:
                w[p + "mlp.expert_bias"] = _uniform(g, E, expert_bias_range).to(expert_bias_dtype)
            for j in range(E):
                w.update(swiglu(p + f"mlp.experts.{j}.", mat, d, c["expert_intermediate_size"]))
        else:
            w.update(swiglu(p + "mlp.", mat, d, c["dense_intermediate_size"]))
        if c["shared_expert_intermediate_size"] is not None:        # on the decoder layer, not under mlp
            w.update(swiglu(p + "shared_expert.", mat, d, c["shared_expert_intermediate_size"]))
    w["model.norm.weight"] = norm(d)
    w["lm_head.weight"] = _head(mat(c["vocab_size"], d), logit_scale)
    return _write(out, c, w, dtype, sharded, LLADA_MOE_CHAT_TEMPLATE)


# keys a caller may add that the published config.json lacks
_EXTRA_KEYS = {"llada2_moe": {"use_qk_norm", "mask_token_id", "eos_token_id", "torch_dtype",
                              "expert_capacity", "block_size", "delete_token_id", "split_token_id"},
               "llada_moe": {"dense_intermediate_size", "rms_norm_eps", "mask_token_id", "bos_token_id"}}


def published_config(family: str) -> dict:
    """The published config.json of `family` (a model_type of PUBLISHED_DIRS)."""
    return json.loads((PUBLISHED / PUBLISHED_DIRS[family] / "config.json").read_text())


def _config(family: str, overrides: dict, drop_keys, tiny: dict) -> dict:
    c = published_config(family)
    unknown = set(overrides) - set(c) - set(tiny) - _EXTRA_KEYS[family]
    if unknown:
        raise ValueError(f"not a {family} config key: {sorted(unknown)}")
    c.update(tiny)
    c.update(overrides)
    for key in drop_keys:
        c.pop(key)
    return dict(sorted(c.items()))                                # published order: alphabetical


def _uniform(g: torch.Generator, n: int, r: float) -> torch.Tensor:
    return (torch.rand(n, generator=g) * 2 - 1) * r


def swiglu(prefix: str, mat, d: int, ffn: int) -> dict:
    return {prefix + "gate_proj.weight": mat(ffn, d), prefix + "up_proj.weight": mat(ffn, d),
            prefix + "down_proj.weight": mat(d, ffn)}


def _head(head: torch.Tensor, logit_scale: float) -> torch.Tensor:
    """(V, d): scaled by logit_scale; the mask row and the rows past the tokenizer scaled down 20x more."""
    head = head * logit_scale
    head[MASK_ID] *= 0.05
    head[TOKENIZER_LEN:] *= 0.05
    return head


def _write(out: Path, config: dict, w: dict, dtype, sharded: bool, chat_template: str) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID})
    write_safetensors(out, {k: v if k.endswith("expert_bias") else v.to(dtype) for k, v in w.items()},
                      layer_shards(config["num_hidden_layers"], 3) if sharded else None)
    _tokenizer(out, chat_template)
    return out


def _tokenizer(out: Path, chat_template: str) -> None:
    """tokenizer.json (tiny-code's BPE + the Ling specials), tokenizer_config.json, special_tokens_map.json."""
    tok = json.loads(BASE_TOKENIZER.read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    for old in [t["content"] for t in tok["added_tokens"]]:       # tiny-code's LLaDA specials: never produced
        i = vocab.pop(old)
        vocab[f"<|tiny_unused_{i}|>"] = i
    tok["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    assert len(vocab) == BASE_VOCAB
    tok["added_tokens"] = [dict(id=BASE_VOCAB + i, content=t, single_word=False, lstrip=False, rstrip=False,
                                normalized=False, special=True) for i, t in enumerate(LING_SPECIALS)]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    bos, eos, role, role_close, mask, role_end = LING_SPECIALS
    extra = [role, role_close, role_end]
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_eos_token": False,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in tok["added_tokens"]},
        "additional_special_tokens": extra, "bos_token": bos, "chat_template": chat_template,
        "clean_up_tokenization_spaces": False, "eos_token": eos, "mask_token": mask, "model_max_length": 32768,
        "pad_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"})
    write_json(out / "special_tokens_map.json", {"additional_special_tokens": extra, "bos_token": bos, "eos_token": eos,
                                            "mask_token": mask, "pad_token": eos})

