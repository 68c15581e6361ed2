"""Random-weight checkpoints of Steerling-8B (`steerling`, docs/specs/steerling.md 1, 9) in the Hub
layout: the flat config.json and tokenizer_config.json that guidelabs' build_hf_files.py writes,
tensors under the names of docs 1.1 (backbone, known head, factorized unknown head), tied head
unless weight_sharing is false. Written tensor by tensor with safetensors (no fastdllm class).

The vocabulary follows the real layout on a small rank file (`cl100k_base.tiktoken` in the
folder, tiktoken's format): 256 byte tokens and 24 merges (ranks 0-279), `<|endoftext|>` one past
a gap (281, as 100257 follows 100255), then pad, bos, endofchunk, mask; the instruct variant adds
the three chat ids and the chat template."""

from __future__ import annotations

import base64
from pathlib import Path

import torch

from .files import DTYPE_NAMES, write_json, write_safetensors

MERGES = [b"th", b"he", b"in", b"an", b"er", b"on", b" a", b"re", b"at", b"en", b"nd", b"is", b"it", b"ou",
          b"es", b"or", b"ed", b"to", b" t", b"the", b" the", b" and", b"ing", b" is"]
RANKS = 256 + len(MERGES)
EOS, PAD, BOS, ENDOFCHUNK, MASK = RANKS + 1, RANKS + 2, RANKS + 3, RANKS + 4, RANKS + 5
START_HEADER, END_HEADER, EOT = RANKS + 6, RANKS + 7, RANKS + 8
CHAT_TEMPLATE = ("{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
                 "{{ message['content'] }}<|endofchunk|><|eot_id|>{% endfor %}"
                 "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
TINY = {"n_layers": 2, "n_head": 4, "n_kv_heads": 2, "n_embd": 64, "block_size": 256, "diff_block_size": 8,
        "intermediate_size": 48, "n_concepts": 20, "n_unknown_concepts": 40, "concept_dim": 64, "factorize_rank": 16,
        "topk_known": 4, "topk_known_features": 4, "unknown_topk": 8}


def steerling_config(instruct: bool = False) -> dict:
    """config.json in build_config_json's keys and order, the 8B's values (docs 1)."""
    c = {"model_type": "steerling",
         "auto_map": {"AutoConfig": "configuration_steerling.SteerlingConfig",
                      "AutoModel": "modeling_steerling.SteerlingForCausalLM",
                      "AutoModelForCausalLM": "modeling_steerling.SteerlingForCausalLM",
                      "AutoTokenizer": ["tokenization_steerling.SteerlingTokenizer", None]},
         "architectures": ["SteerlingForCausalLM"], "interpretable": True, "vocab_size": 100281, "n_layers": 32,
         "n_head": 32, "n_embd": 4096, "n_kv_heads": 4, "block_size": 4096, "diff_block_size": 64, "use_rms_norm": True,
         "norm_eps": 1e-5, "norm_order": "post", "use_qk_norm": True, "use_rope": True, "rope_base": 500000.0,
         "rope_full_precision": True, "clip_qkv": 10.0, "mlp_type": "swiglu", "activation": "gelu", "mlp_ratio": 4,
         "intermediate_size": None, "use_bias": False, "weight_sharing": True, "pad_token_id": 100277,
         "bos_token_id": 100278, "eos_token_id": 100257, "mask_token_id": 100280, "endofchunk_token_id": 100279,
         "n_concepts": 33732, "n_unknown_concepts": 101196, "concept_dim": 4096, "use_attention_known": False,
         "use_attention_unknown": False, "topk_known": 16, "topk_known_features": 32, "unknown_topk": 128,
         "use_unknown": True, "apply_topk_to_unknown": True, "topk_on_logits": False, "factorize_unknown": True,
         "factorize_rank": 256, "use_epsilon_correction": True, "concept_block_size": 4096, "pad_multiple": 16,
         "store_unknown_weights": False, "inject_layer": 16, "inject_alpha": 1.0, "torch_dtype": "bfloat16",
         "transformers_version": "4.48.0"}
    if instruct:
        c.update(vocab_size=100284, start_header_id=100281, end_header_id=100282, eot_id=100283)
    return c


def write_steerling(out: Path, *, seed=0, instruct=False, dtype=torch.float32, sharded=False, qkv_scale=1.0,
                    eot_row: torch.Tensor | None = None, **config) -> Path:
    """The Hub layout with the TINY sizes and the small vocabulary; `config` overrides config.json
    keys (diff_block_size=64, clip_qkv=None, weight_sharing=False, intermediate_size=None, ...).
    `qkv_scale` scales c_attn (large: the clamp at clip_qkv bites); `eot_row` (n_embd,) replaces the
    `<|eot_id|>` embedding row (tied head: a row along the masks' final hidden states makes the
    instruct model write it; the row is read as an input only once EOT is on the canvas)."""
    c = steerling_config(instruct)
    unknown = set(config) - set(c)
    if unknown:
        raise ValueError(f"not a steerling config key: {sorted(unknown)}")
    c.update(TINY, vocab_size=EOT + 1 if instruct else MASK + 1, pad_token_id=PAD, bos_token_id=BOS,
             eos_token_id=EOS, mask_token_id=MASK, endofchunk_token_id=ENDOFCHUNK, torch_dtype=DTYPE_NAMES[dtype])
    if instruct:
        c.update(start_header_id=START_HEADER, end_header_id=END_HEADER, eot_id=EOT)
    c.update(config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", c)
    write_json(out / "tokenizer_config.json", tokenizer_config(instruct))
    (out / "cl100k_base.tiktoken").write_text(rank_file())
    w = weights(c, torch.Generator().manual_seed(seed), qkv_scale)
    if eot_row is not None:
        w["transformer.tok_emb.weight"][c["eot_id"]] = eot_row
    # sharded: two files (backbone, heads)
    write_safetensors(out, {k: v.to(dtype) for k, v in w.items()},
                      (lambda k: 1 if k.startswith("transformer.") else 2) if sharded else None)
    return out


def tokenizer_config(instruct: bool) -> dict:
    """build_tokenizer_config_json's keys; the instruct variant with its chat ids and template."""
    t = {"tokenizer_class": "SteerlingTokenizer",
         "auto_map": {"AutoTokenizer": ["tokenization_steerling.SteerlingTokenizer", None]},
         "pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|endoftext|>",
         "additional_special_tokens": ["<|endofchunk|>", "<|mask|>"], "encoding_name": "cl100k_base",
         "pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS, "endofchunk_token_id": ENDOFCHUNK,
         "mask_token_id": MASK}
    if instruct:
        t.update(start_header_id=START_HEADER, end_header_id=END_HEADER, eot_id=EOT, chat_template=CHAT_TEMPLATE)
    return t


def rank_file() -> str:
    """tiktoken's format: base64 of the token's bytes and its rank, a line each."""
    tokens = [bytes([b]) for b in range(256)] + MERGES
    return "".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens))


def weights(c: dict, g: torch.Generator, qkv_scale: float) -> dict:
    """Random fp64 tensors under the Hub names; norm weights around 1, concept heads small."""
    d, hd, kv, inner = c["n_embd"], c["n_embd"] // c["n_head"], c["n_kv_heads"], c["intermediate_size"] or \
        c["mlp_ratio"] * c["n_embd"]

    def rand(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def padded(n):
        return -(-n // c["pad_multiple"]) * c["pad_multiple"]

    w = {"transformer.tok_emb.weight": rand(c["vocab_size"], d, std=0.3),
         "transformer.ln_f.weight": 1 + rand(d, std=0.1)}
    for i in range(c["n_layers"]):
        p = f"transformer.blocks.{i}."
        w.update({p + "attn.c_attn.weight": rand(d + 2 * kv * hd, d, std=qkv_scale / d ** 0.5),
                  p + "attn.c_proj.weight": rand(d, d, std=1 / d ** 0.5),
                  p + "attn.q_norm.weight": 1 + rand(hd, std=0.1), p + "attn.k_norm.weight": 1 + rand(hd, std=0.1),
                  p + "ln_1.weight": 1 + rand(d, std=0.1), p + "ln_2.weight": 1 + rand(d, std=0.1),
                  p + "mlp.c_fc.weight": rand(2 * inner, d, std=1 / d ** 0.5),
                  p + "mlp.c_proj.weight": rand(d, inner, std=1 / inner ** 0.5)})
    if not c["weight_sharing"]:
        w["transformer.lm_head.weight"] = rand(c["vocab_size"], d, std=0.3)
    known, unknown, r = padded(c["n_concepts"]), padded(c["n_unknown_concepts"]), c["factorize_rank"]
    w.update({"known_head.concept_embedding.weight": rand(known, c["concept_dim"], std=0.05),
              "known_head.concept_predictor.weight": rand(known, d, std=0.05),
              "unknown_head.embedding_coef.weight": rand(unknown, r, std=0.05),
              "unknown_head.embedding_basis.weight": rand(c["concept_dim"], r, std=0.05),
              "unknown_head.predictor_down.weight": rand(r, d, std=0.05),
              "unknown_head.predictor_up.weight": rand(unknown, r, std=0.05)})
    return w
