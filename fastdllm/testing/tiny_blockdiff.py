"""Random-weight checkpoints of the two block-diffusion families in their exact published layouts:
Fast-dLLM v2 (`Fast_dLLM_Qwen`, layout of Efficient-Large-Model/Fast_dLLM_v2_7B, docs/specs/fast-dllm-v2.md)
and SDAR (`sdar`, layout of JetLM/SDAR-4B-Chat, docs/specs/sdar.md). Written tensor by tensor with
safetensors (no fastdllm model class): config keys in the published order, Qwen2 / Qwen3 tensor
names, shard index, generation config, and the real Qwen2 byte-level BPE (vocab.json, merges.txt)
with each family's added tokens. Only the sizes and the weights differ from the originals; the
embedding keeps its published row count (151936 / 152064), hence files of 20-40 MB.

Weights: normal(0, init_std) for matrices, embeddings and biases; every RMSNorm weight (q_norm and
k_norm included) is 1 + N(0, 0.1^2). The output head is scaled by `logit_scale` (as in
tiny_random) so that greedy confidences over the 152k vocabulary vary (many above 0.9, many below
0.5); with a tied head the embedding itself is scaled.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch

from .files import DTYPE_NAMES, layer_shards, normal_makers, write_json, write_safetensors
from .tiny_random import FIXTURES

# Added tokens shared by Qwen2.5 and Qwen3 (id, content, special), then each family's own.
_QWEN2_ADDED = [(151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
                (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True),
                (151648, "<|box_start|>", True), (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True),
                (151651, "<|quad_end|>", True), (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True),
                (151654, "<|vision_pad|>", True), (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True),
                (151657, "<tool_call>", False), (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False),
                (151660, "<|fim_middle|>", False), (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False),
                (151663, "<|repo_name|>", False), (151664, "<|file_sep|>", False)]
V2_ADDED = _QWEN2_ADDED + [(151665, "|<MASK>|", True)]
SDAR_ADDED = _QWEN2_ADDED + [(151665, "<tool_response>", False), (151666, "</tool_response>", False),
                             (151667, "<think>", False), (151668, "</think>", False), (151669, "<|MASK|>", False)]
V2_MASK_ID, V2_STOP_ID, SDAR_MASK_ID = 151665, 151645, 151669

# Qwen3 ChatML as shipped with SDAR (chat_template.jinja == tokenizer_config's chat_template), without
# the tool-calling branches: renders byte-identically for system/user/assistant chats (no default system
# prompt, <think> content stripped from earlier assistant turns, `enable_thinking=False` adds an empty one).
QWEN3_CHAT_TEMPLATE = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in message.content %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


def write_fast_dllm_v2(out: Path, *, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                       tie_word_embeddings=False, sharded=True, bd_size=32, seed=0, init_std=0.3, logit_scale=4.0,
                       dtype=torch.bfloat16, fixtures: Path = FIXTURES) -> Path:
    """Fast_dLLM_v2_7B's layout (untied, vocab 152064, 4 shards); `tie_word_embeddings=True` gives the
    1.5B's (vocab 151936, no lm_head.weight). No head_dim key: head_dim = hidden_size // n_heads."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = 151936 if tie_word_embeddings else 152064
    config = {
        "architectures": ["Fast_dLLM_QwenForCausalLM"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                     "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
        "bd_size": bd_size, "bos_token_id": 151643, "conplemenrary_mask": True, "eos_token_id": 151645,
        "hidden_act": "silu", "hidden_size": hidden_size, "initializer_range": 0.02,
        "intermediate_size": intermediate_size, "layer_types": ["full_attention"] * n_layers,
        "max_position_embeddings": 32768, "max_window_layers": n_layers, "model_type": "Fast_dLLM_Qwen",
        "num_attention_heads": n_heads, "num_hidden_layers": n_layers, "num_key_value_heads": n_kv_heads,
        "pad_token_id": 151645, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": tie_word_embeddings, "torch_dtype": DTYPE_NAMES[dtype],
        "transformers_version": "4.53.1", "use_cache": True, "use_sliding_window": False, "vocab_size": vocab}
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {
        "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
        "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "transformers_version": "4.53.1"})
    hd = hidden_size // n_heads
    w = _weights(vocab, hidden_size, n_layers, n_heads * hd, n_kv_heads * hd, hd, intermediate_size, bias=True,
                 qk_norm=False, tied=tie_word_embeddings, seed=seed, std=init_std, logit_scale=logit_scale)
    # 7B: embedding and layers over shards 1-3, norm in 3, lm_head alone in 4 (tied: 3 shards)
    _save(out, w, dtype, sharded, n_layers, 3, head_alone=not tie_word_embeddings, param_count=True)

    src = Path(fixtures) / "Dream-v0-Instruct-7B"
    _qwen_bpe(src, out)
    write_json(out / "added_tokens.json", {c: i for i, c, _ in V2_ADDED}, sort_keys=True)
    write_json(out / "special_tokens_map.json", {"additional_special_tokens": [_tok("|<MASK>|")], "eos_token": _tok("<|im_end|>"),
                                            "pad_token": _tok("<|endoftext|>")})
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": _decoder(V2_ADDED),
        "additional_special_tokens": ["|<MASK>|"], "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "extra_special_tokens": {}, "model_max_length": 131072,
        "pad_token": "<|endoftext|>", "padding_side": "right", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    # Qwen2.5's ChatML, byte-identical to the copy kept in Dream's tokenizer_config.json
    template = json.loads((src / "tokenizer_config.json").read_text())["chat_template"]
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    return out


def write_sdar(out: Path, *, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, intermediate_size=128,
               block_size: int | None = 4, mask_in_config=True, sharded=True, seed=0, init_std=0.3, logit_scale=4.0,
               dtype=torch.bfloat16, fixtures: Path = FIXTURES) -> Path:
    """SDAR-4B-Chat's layout (Qwen3 with q_norm/k_norm, explicit head_dim, untied head, vocab 151936,
    2 shards). `block_size` / `mask_token_id` are written only when asked (the original configs lack
    them; the R3 copies have them)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = 151936
    config = {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
        "bos_token_id": 151643, "debug": False, "eos_token_id": 151643}
    if block_size is not None:
        config["block_size"] = block_size
    if mask_in_config:
        config["mask_token_id"] = SDAR_MASK_ID
    config.update({
        "ep_size": 1, "fuse_cross_entropy": True, "head_dim": head_dim, "hidden_act": "silu",
        "hidden_size": hidden_size, "initializer_range": 0.02, "intermediate_size": intermediate_size,
        "max_position_embeddings": 32768, "max_window_layers": n_layers, "micro_forward": False, "model_type": "sdar",
        "num_attention_heads": n_heads, "num_hidden_layers": n_layers, "num_key_value_heads": n_kv_heads,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "skip_checkpoint": False,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": DTYPE_NAMES[dtype],
        "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False, "use_sliding_window": False,
        "vocab_size": vocab})
    write_json(out / "config.json", config)
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
        "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}, indent=4))
    w = _weights(vocab, hidden_size, n_layers, n_heads * head_dim, n_kv_heads * head_dim, head_dim, intermediate_size,
                 bias=False, qk_norm=True, tied=False, seed=seed, std=init_std, logit_scale=logit_scale)
    _save(out, w, dtype, sharded, n_layers, 2, head_alone=False, param_count=False)

    _qwen_bpe(Path(fixtures) / "Dream-v0-Instruct-7B", out)
    added = {c: i for i, c, _ in SDAR_ADDED}
    added["<MASK>"] = added.pop("<|MASK|>")          # spelled <MASK> here and in special_tokens_map.json
    write_json(out / "added_tokens.json", added, sort_keys=True)
    extra = [c for i, c, _ in SDAR_ADDED if 151644 <= i <= 151656]
    write_json(out / "special_tokens_map.json", {"additional_special_tokens": extra + ["<MASK>"],
                                            "eos_token": _tok("<|endoftext|>"), "pad_token": _tok("<|endoftext|>")})
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": _decoder(SDAR_ADDED),
        "additional_special_tokens": extra + ["<|MASK|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_qwen2.Qwen2Tokenizer", None]}, "bos_token": None,
        "chat_template": QWEN3_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
        "mask_token": "<|MASK|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    (out / "chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE, encoding="utf-8")
    return out


def _weights(vocab, d, n_layers, q_out, kv_out, hd, ffn, *, bias, qk_norm, tied, seed, std, logit_scale):
    mat, norm = normal_makers(torch.Generator().manual_seed(seed), std)

    w = {"model.embed_tokens.weight": mat(vocab, d)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        for name, rows in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            w[p + f"self_attn.{name}_proj.weight"] = mat(rows, d)
            if bias:
                w[p + f"self_attn.{name}_proj.bias"] = mat(rows)
        w[p + "self_attn.o_proj.weight"] = mat(d, q_out)
        if qk_norm:
            w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = norm(hd), norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = mat(ffn, d), mat(ffn, d)
        w[p + "mlp.down_proj.weight"] = mat(d, ffn)
    w["model.norm.weight"] = norm(d)
    if tied:
        w["model.embed_tokens.weight"] *= logit_scale
    else:
        w["lm_head.weight"] = mat(vocab, d) * logit_scale
    return w


def _save(out: Path, w: dict, dtype, sharded: bool, n_layers: int, n_body: int, *, head_alone: bool,
          param_count: bool) -> None:
    """One model.safetensors, or the published sharding: embedding in shard 1, layers spread over
    shards 1..n_body, final norm in shard n_body, lm_head in shard n_body (SDAR) or alone after it (v2)."""
    layers = layer_shards(n_layers, n_body)

    def shard(name):
        return n_body + 1 if head_alone and name == "lm_head.weight" else layers(name)

    write_safetensors(out, {k: v.to(dtype) for k, v in w.items()}, shard if sharded else None,
                      total_parameters=param_count)


def _qwen_bpe(src: Path, out: Path) -> None:
    """The base Qwen2 vocabulary (shared by Qwen2.5 and Qwen3): merges.txt byte-identical, vocab.json
    re-serialised compactly in id order, byte-identical to the file both families ship."""
    (out / "vocab.json").write_bytes(_compact_vocab(str(src / "vocab.json")))
    shutil.copyfile(src / "merges.txt", out / "merges.txt")


@functools.lru_cache(maxsize=2)
def _compact_vocab(path: str) -> bytes:
    vocab = json.loads(Path(path).read_text(encoding="utf-8"))
    ordered = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    return json.dumps(ordered, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _tok(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _decoder(added) -> dict:
    return {str(i): dict(_tok(c), special=s) for i, c, s in added}

