"""Random-weight checkpoints of Nemotron-Labs Diffusion (`nemotron_labs_diffusion`,
docs/specs/nemotron-diffusion.md) in its published layout, written tensor by tensor with safetensors (no
fastdllm model class).

config.json holds the 8B's published keys (shared/specs/new-families.md §1, a third-party copy) in
transformers' sorted order, with only the size keys shrunk and `original_max_position_embeddings`
made small (16) so that short tests reach positions where YaRN and the Llama-4 query scale matter.
`auto_map` names the checkpoint's remote-code files (never run). The sharding into two files is ours
(the published index was not seen); the tensor names are the published ones.

No tokenizer of the family is public (its 131072-id Tekken tokenizer was not found): this writes a
small real one of our own, a byte-level BPE with no merges in a tokenizer.json (ids 0-999 special
slots as in Mistral's Tekken layout: `<unk>` 0, `<s>` 1, `</s>` 2, `<SPECIAL_n>` otherwise; the 256
bytes at 1000-1255), no chat template (fastdllm then chats with a plain transcript). Mask 100 and
eos 11 are config.json's ids, as published.

`write_adapter` writes `linear_spec_lora/` (PEFT's layout: adapter_config.json with r 128,
lora_alpha 512 on o_proj as the fork's guide states, adapter_model.safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from .files import DTYPE_NAMES, normal_makers, write_json, write_safetensors

MASK_ID, EOS_ID, BOS_ID = 100, 11, 1
N_SPECIAL, BYTES_AT = 1000, 1000
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 1280}


def nemotron_config() -> dict:
    """config.json of Nemotron-Labs-Diffusion-8B (new-families.md §1), keys sorted as transformers saves them."""
    c = {"architectures": ["NemotronLabsDiffusionModel"], "ar_loss_weight": 1.0, "attn_implementation": "sdpa",
         "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                      "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
         "block_size": 32, "bos_token_id": BOS_ID, "dlm_loss_weight": None, "dlm_paradigm": "bidirectional",
         "dp_varying_mask_ratio": False, "eos_token_id": EOS_ID, "head_dim": 128, "hidden_act": "silu",
         "hidden_size": 4096, "intermediate_size": 14336, "mask_token_id": MASK_ID, "max_position_embeddings": 262144,
         "model_type": "nemotron_labs_diffusion", "num_attention_heads": 32, "num_hidden_layers": 34,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
         "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                             "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16384,
                             "rope_theta": 1000000.0, "rope_type": "yarn"},
         "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         "transformers_version": "5.0.0", "use_cache": False, "vocab_size": 131072}
    return c


def write_nemotron(out: Path, *, seed=0, init_std=0.3, logit_scale=4.0, original_max=16, dtype=torch.bfloat16,
                   block_size=32, favoured: int = 0, favour_scale: float = 3.0, **sizes) -> Path:
    """The published layout at TINY sizes (`sizes` overrides them); weights normal(0, init_std),
    RMSNorm weights 1 + N(0, 0.1^2), the head scaled by `logit_scale` (confidences that vary).
    `favoured` n: the head rows of the first n byte tokens scaled up, so that most predictions
    are among them (`favour_scale`: by how much) and drafts often agree with the causal argmax (self-speculation accepts some)."""
    c = nemotron_config()
    unknown = set(sizes) - set(TINY)
    if unknown:
        raise ValueError(f"not a size key: {sorted(unknown)}")
    c.update({**TINY, **sizes, "block_size": block_size, "torch_dtype": DTYPE_NAMES[dtype]})
    c["rope_parameters"]["original_max_position_embeddings"] = original_max
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", c, sort_keys=True)
    write_json(out / "generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
                                           "transformers_version": "5.0.0"})
    w = _weights(c, seed, init_std, logit_scale)
    w["diffusion_head.weight"][BYTES_AT:BYTES_AT + favoured] *= favour_scale
    # two shards of our own: embedding and layers; final norm and head
    write_safetensors(out, {k: v.to(dtype) for k, v in w.items()},
                      lambda k: 2 if k in ("encoder.norm.weight", "diffusion_head.weight") else 1)
    write_tokenizer(out)
    return out


def _weights(c: dict, seed: int, std: float, logit_scale: float) -> dict[str, torch.Tensor]:
    mat, norm = normal_makers(torch.Generator().manual_seed(seed), std)
    d, hd, ffn = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    w = {"encoder.embed_tokens.weight": mat(c["vocab_size"], d)}
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            w[p + f"self_attn.{name}_proj.weight"] = mat(rows, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, q)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = mat(ffn, d), mat(ffn, d)
        w[p + "mlp.down_proj.weight"] = mat(d, ffn)
    w["encoder.norm.weight"] = norm(d)
    w["diffusion_head.weight"] = mat(c["vocab_size"], d) * logit_scale
    return w


def write_tokenizer(out: Path) -> None:
    """Our byte-level tokenizer (tokenizer.json + tokenizer_config.json), see the module's note."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    specials = ["<unk>", "<s>", "</s>", *(f"<SPECIAL_{i}>" for i in range(3, N_SPECIAL))]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({ch: BYTES_AT + i for i, ch in enumerate(bytes_to_unicode().values())})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out))


def write_adapter(out: Path, *, n_layers: int, hidden_size: int, q_out: int, r=128, alpha=512, seed=1,
                  std=0.05, dtype=torch.bfloat16) -> Path:
    """`out/linear_spec_lora/`: a LoRA on every o_proj in PEFT's layout (A: r x q_out, B: d x r)."""
    lora = Path(out) / "linear_spec_lora"
    lora.mkdir(parents=True, exist_ok=True)
    write_json(lora / "adapter_config.json", {
        "base_model_name_or_path": None, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "lora_alpha": alpha, "lora_dropout": 0.0, "peft_type": "LORA", "r": r, "target_modules": ["o_proj"],
        "task_type": None, "use_dora": False, "use_rslora": False})
    g = torch.Generator().manual_seed(seed)
    w = {}
    for i in range(n_layers):
        p = f"base_model.model.encoder.layers.{i}.self_attn.o_proj."
        w[p + "lora_A.weight"] = torch.randn(r, q_out, generator=g) * std
        w[p + "lora_B.weight"] = torch.randn(hidden_size, r, generator=g) * std
    save_file({k: v.to(dtype).contiguous() for k, v in w.items()}, str(lora / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    return lora
