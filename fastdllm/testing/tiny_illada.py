"""Random-weight checkpoints of iLLaDA-8B (`ILLaDAForCausalLM`, docs/specs/illada.md) in the layout its
spec describes. No iLLaDA file was read (docs/specs/illada.md 6), so this is the layout as known second
hand, not a copy: what is unconfirmed is marked [U] below and in ILLADA_CONFIG.

- config.json: the keys M (the modeling file) reads, in transformers' LlamaConfig-like naming, with
  the model card's sizes; `model_type "illada"` [U: seen only in third-party test doubles];
  rope_theta and rms_norm_eps [U: values unknown, placeholders]; no mask_token_id (T2).
- tensors: Llama names (`model.embed_tokens`, `model.layers.N.self_attn.{q,k,v,o}_proj`,
  `mlp.{gate,up,down}_proj`, two norms per layer, `model.norm`), no biases; `lm_head.weight` is
  written only with `store_head` (whether the shards hold it is unknown: both must load).
- tokenizer: a byte-level BPE without merges whose first ids are iLLaDA's specials as known
  second hand, bos 0, pad 1, eos 2, `<[MASK]>` 5 [U: the spellings of 0-4 are placeholders];
  `<think>` / `</think>` as added tokens with `think_tokens` (unknown whether `</think>` is one
  token: without them it is eight byte tokens). No chat template (none was published where read).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .files import layer_shards, write_config, write_json, write_safetensors

BOS_ID, PAD_ID, EOS_ID, MASK_ID = 0, 1, 2, 5
# ids 0-5: the ids are second hand (T3, ANN), the spellings of 0-4 are ours [U]
SPECIALS = ["<|bos|>", "<|pad|>", "<|eos|>", "<|unk|>", "<|reserved_4|>", "<[MASK]>"]
THINK = ["<think>", "</think>"]
BYTES = 256
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 96, "vocab_size": len(SPECIALS) + BYTES + len(THINK), "max_position_embeddings": 512}
SIZE_KEYS = set(TINY)


def illada_config() -> dict:
    """config.json at the published sizes (docs/specs/illada.md 1.1; [U] values as marked there)."""
    return {"architectures": ["ILLaDAForCausalLM"],
            "attention_bias": False, "attention_dropout": 0.0,
            "auto_map": {"AutoConfig": "configuration_illada.ILLaDAConfig",
                         "AutoModel": "modeling_illada.ILLaDAForCausalLM",
                         "AutoModelForCausalLM": "modeling_illada.ILLaDAForCausalLM"},
            "bos_token_id": BOS_ID, "dtype": "bfloat16", "eos_token_id": EOS_ID, "hidden_act": "silu",
            "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "layer_norm_eps": None,
            "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "illada", "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "pad_token_id": PAD_ID, "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": True,
            "transformers_version": "4.57.1", "use_cache": True, "vocab_size": 155136}


def write_illada(out: Path, *, seed=0, init_std=0.5, embed_scale=1.0, qk_scale=12.0, sharded=False, dtype=torch.bfloat16,
                 store_head=False, think_tokens=True, drop=(), **config) -> Path:
    """iLLaDA's layout at the TINY sizes; `config` overrides config.json keys, `drop` removes some."""
    out, c = write_config(out, illada_config(), "illada", TINY, config, drop, dtype)
    write_json(out / "generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
                                           "transformers_version": "4.57.1"})            # [U] T3's ids
    write_tokenizer(out, think_tokens)
    w = _weights(c, torch.Generator().manual_seed(seed), init_std, embed_scale, qk_scale)
    if store_head:
        w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
    write_safetensors(out, {k: v.to(dtype) for k, v in w.items()},
                      layer_shards(c["num_hidden_layers"], 3) if sharded else None)
    return out


def _weights(c: dict, g: torch.Generator, std: float, embed_scale: float, qk_scale: float) -> dict[str, torch.Tensor]:
    """Normal(0, std) matrices scaled by 1/sqrt(fan-in), q and k by qk_scale more (sharp, position-
    dependent attention: the masks' predictions differ from slot to slot, so answers are varied
    rather than one token repeated), the embedding by embed_scale; norms 1 + N(0, 0.1^2)."""
    d, ffn, n_layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd

    def mat(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def norm():
        return 1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)

    w = {"model.embed_tokens.weight": mat(c["vocab_size"], d) * embed_scale}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": norm(), p + "self_attn.q_proj.weight": mat(d, d) * qk_scale / d ** 0.5,
                  p + "self_attn.k_proj.weight": mat(kv, d) * qk_scale / d ** 0.5,
                  p + "self_attn.v_proj.weight": mat(kv, d),
                  p + "self_attn.o_proj.weight": mat(d, d) / d ** 0.5, p + "post_attention_layernorm.weight": norm(),
                  p + "mlp.gate_proj.weight": mat(ffn, d) / d ** 0.5, p + "mlp.up_proj.weight": mat(ffn, d) / d ** 0.5,
                  p + "mlp.down_proj.weight": mat(d, ffn) / ffn ** 0.5})
    w["model.norm.weight"] = norm()
    return w


def write_tokenizer(out: Path, think_tokens: bool = True) -> None:
    """tokenizer.json (byte-level, no merges: ids 6-261 are the 256 byte characters), tokenizer_config.json
    and special_tokens_map.json; no mask_token or unk_token declared (T2), no chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())                # 256 characters, one per byte
    vocab = {t: i for i, t in enumerate(SPECIALS)} | {ch: len(SPECIALS) + i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIALS])
    if think_tokens:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in THINK])
    tok.save(str(out / "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": i < len(SPECIALS)}
             for i, t in [*enumerate(SPECIALS), *((len(vocab) + j, t) for j, t in enumerate(THINK) if think_tokens)]}
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": added, "bos_token": SPECIALS[BOS_ID],
        "clean_up_tokenization_spaces": False, "eos_token": SPECIALS[EOS_ID], "model_max_length": 8192,
        "pad_token": SPECIALS[PAD_ID], "tokenizer_class": "PreTrainedTokenizerFast"})
    write_json(out / "special_tokens_map.json", {"bos_token": SPECIALS[BOS_ID], "eos_token": SPECIALS[EOS_ID],
                                            "pad_token": SPECIALS[PAD_ID]})

