"""Random-weight DiffusionGemma checkpoints in the published layout of
google/diffusiongemma-26B-A4B-it (docs/specs/diffusion-gemma.md §1-§2, §6), at any size.

config.json as published: root keys, a `text_config` with `global_head_dim` and
`num_global_key_value_heads` (not transformers' saved `per_layer_config` form), a small
`vision_config`; generation_config.json with the published sampler settings; one safetensors file
with the tensors under their published names (`model.decoder.*`, the encoder's own
`model.encoder.language_model.layers.N.layer_scalar`, tied head, packed 3-D experts) plus two vision
tensors a text run must ignore. The tokenizer is a small byte-level BPE with Gemma-4's special
tokens at their published ids (pad 0, eos 1, bos 2, unk 3, mask 4, `<|tool_response>` 50,
`<|think|>` 98, `<|channel>` 100, `<channel|>` 101, `<|turn>` 105, `<turn|>` 106): the real
262,144-piece vocabulary could not be obtained here. The chat template is a reconstruction of
Gemma-4's from its documented outputs (thinking off pre-fills an empty thought; thinking on adds a
system turn holding `<|think|>`), not a copy of the published file."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .files import write_json, write_safetensors

SPECIAL_IDS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 50: "<|tool_response>", 98: "<|think|>",
               100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>"}
# google/diffusiongemma-26B-A4B-it's text_config sizes (docs/specs/diffusion-gemma.md §1): 30 layers, 5 sliding to 1 full
PUBLISHED_TEXT = dict(vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=256, global_head_dim=512,
                      num_global_key_value_heads=2, sliding_window=1024, num_experts=128, top_k_experts=8,
                      moe_intermediate_size=704, final_logit_softcapping=30.0, max_position_embeddings=262144)
GENERATION = {"bos_token_id": 2, "eos_token_id": [1, 106, 50], "max_denoising_steps": 48, "max_new_tokens": 256,
              "pad_token_id": 0, "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
              "confidence_threshold": 0.005, "stability_threshold": 1, "t_max": 0.8, "t_min": 0.4}
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- if enable_thinking or system -%}"
    "{{ '<|turn>system\\n' }}{% if enable_thinking %}{{ '<|think|>\\n' }}{% endif %}{{ system }}{{ '<turn|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{{ '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{{ message['content'] | trim }}{{ '<turn|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\\n' }}"
    "{%- if not enable_thinking %}{{ '<|channel>thought\\n<channel|>' }}{% endif -%}"
    "{%- endif -%}")


def write_diffusion_gemma(out: Path, *, max_denoising_steps=48, seed=0, init_std=0.4, embed_std=0.2,
                          dtype=torch.bfloat16, **sizes) -> Path:
    """A tiny checkpoint (gemma_config's `sizes`); defaults exercise both layer kinds (sliding with 2
    KV heads, full with one: k_eq_v and GQA), proportional RoPE, the experts, a sliding window
    shorter than the prompts."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = gemma_config(**sizes, dtype=str(dtype).removeprefix("torch."))
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {**GENERATION, "max_denoising_steps": max_denoising_steps,
                                           "transformers_version": "5.8.0.dev0"})
    weights = _weights(config, seed, init_std, embed_std)
    write_safetensors(out, {k: v.to(dtype) for k, v in weights.items()})
    _tokenizer(out, config["text_config"]["vocab_size"])
    return out


def gemma_config(*, vocab_size=512, hidden_size=32, intermediate_size=48,
                 layer_types=("sliding_attention", "sliding_attention", "full_attention"), num_attention_heads=2,
                 num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, sliding_window=8,
                 num_experts=4, top_k_experts=2, moe_intermediate_size=16, canvas_length=16, dtype="bfloat16") -> dict:
    """config.json in the published layout (root keys, text_config, a small vision_config) at these sizes."""
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "global_head_dim": global_head_dim, "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": hidden_size, "initializer_range": 0.02,
        "intermediate_size": intermediate_size, "layer_types": list(layer_types), "max_position_embeddings": 262144,
        "model_type": "diffusion_gemma_text", "moe_intermediate_size": moe_intermediate_size,
        "num_attention_heads": num_attention_heads, "num_experts": num_experts,
        "num_global_key_value_heads": num_global_key_value_heads, "num_hidden_layers": len(layer_types),
        "num_key_value_heads": num_key_value_heads, "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": sliding_window, "tie_word_embeddings": True, "top_k_experts": top_k_experts,
        "use_bidirectional_attention": "vision", "vocab_size": vocab_size}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 8, "model_type": "gemma4_vision", "patch_size": 16,
              "position_embedding_size": 16}
    config = {"architectures": ["DiffusionGemmaForBlockDiffusion"], "boi_token_id": 255999,
              "canvas_length": canvas_length, "dtype": dtype, "eoi_token_id": 258882,
              "eos_token_id": [1, 106], "image_token_id": 258880, "initializer_range": 0.02,
              "model_type": "diffusion_gemma", "text_config": text, "tie_word_embeddings": True,
              "transformers_version": "5.8.0.dev0", "vision_config": vision}
    return config


def _weights(config: dict, seed: int, std: float, embed_std: float) -> dict[str, torch.Tensor]:
    """Every tensor our model class declares (its names are the published ones), random: matrices
    N(0, std), the embedding N(0, embed_std), norm weights and router scales 1 + 0.3 N(0, 1), both
    layer-scalar sets U(0.5, 1.5); then the two vision tensors."""
    from ..models.diffusion_gemma import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
    )

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(config))
                  .state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("layer_scalar"):
            weights[name] = 0.5 + torch.rand(shape, generator=g)
        elif name.endswith("embed_tokens.weight"):
            weights[name] = torch.randn(shape, generator=g) * embed_std
        elif len(shape) >= 2:
            weights[name] = torch.randn(shape, generator=g) * std
        else:
            weights[name] = 1.0 + 0.3 * torch.randn(shape, generator=g)
    d, v = config["text_config"]["hidden_size"], config["vision_config"]
    weights["model.encoder.embed_vision.embedding_projection.weight"] = torch.randn(d, v["hidden_size"], generator=g)
    weights["model.encoder.vision_tower.patch_embedder.input_proj.weight"] = torch.randn(
        v["hidden_size"], 3 * v["patch_size"] ** 2, generator=g)
    return weights


def _tokenizer(out: Path, vocab_size: int) -> None:
    """A byte-level BPE over a few stdlib files, the special tokens at Gemma-4's ids (the ids between
    them are `<unused{i}>` placeholders, as Gemma's vocabulary has)."""
    specials = [SPECIAL_IDS.get(i, f"<unused{i}>") for i in range(max(SPECIAL_IDS) + 1)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[d-f]*.py"))[:8]
    tok.train_from_iterator([p.read_text(encoding="utf-8") for p in stdlib], trainer=trainer)
    assert all(tok.token_to_id(t) == i for i, t in SPECIAL_IDS.items()) and tok.get_vocab_size() <= vocab_size
    tok.save(str(out / "tokenizer.json"))
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                        "special": True} for i, t in enumerate(specials)}
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": decoder, "bos_token": "<bos>",
        "clean_up_tokenization_spaces": False, "eos_token": "<eos>", "mask_token": "<mask>", "model_max_length": 262144,
        "pad_token": "<pad>", "padding_side": "left", "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>"})
    write_json(out / "special_tokens_map.json", {"bos_token": "<bos>", "eos_token": "<eos>", "mask_token": "<mask>",
                                            "pad_token": "<pad>", "unk_token": "<unk>"})
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")

