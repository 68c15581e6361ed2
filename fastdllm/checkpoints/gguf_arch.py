"""What each GGUF architecture llama.cpp writes for a diffusion model means in fastdllm
(docs/specs/gguf.md sections 2-3 and 9): the family it is, llama.cpp's tensor names -> the published
ones, which rows the converter permuted, whether logits are shifted, and the published config.json
rebuilt from the metadata. Reading and refusing the file is gguf_file.py's job."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import UserError
from .published import FOLDER as PUBLISHED


@dataclass(frozen=True)
class Arch:
    name: str                       # general.architecture
    globals: dict[str, str]         # llama.cpp's name -> the published one
    block: dict[str, str]           # blk.N.<key> -> <prefix>.N.<value>
    prefix: str                     # the published block prefix
    shifted: bool                   # logits at p predict p + 1 (llama.cpp's diffusion.shift_logits)
    permuted: dict[str, str] = field(default_factory=dict)   # module -> config key of its head count
    experts: dict[str, str] = field(default_factory=dict)    # blk.N.<3-D key> -> per-expert published suffix

    def published(self, gguf_name: str) -> str | None:
        """The published name; an expert tensor's holds `{e}` for the expert index."""
        if gguf_name in self.globals:
            return self.globals[gguf_name]
        head, _, rest = gguf_name.partition(".")
        n, _, key = rest.partition(".")
        if head != "blk" or not n.isdigit():
            return None
        if key in self.block:
            return f"{self.prefix}.{n}.{self.block[key]}"
        if key in self.experts:
            return f"{self.prefix}.{n}.{self.experts[key]}"
        return None

    def known(self) -> str:
        return ", ".join([*self.globals, *(f"blk.N.{k}" for k in [*self.block, *self.experts])])


# Qwen2/Qwen3 names (gguf-py tensor_mapping.py: the `qwen2`, `qwen3moe` rows; MODEL_ARCH.DREAM, RND1)
_QWEN_GLOBALS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_QWEN_BLOCK = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_output.weight": "self_attn.o_proj.weight",
               **{f"attn_{x}.{p}": f"self_attn.{x}_proj.{p}" for x in "qkv" for p in ("weight", "bias")}}
_MLP = {f"ffn_{x}.weight": f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
# Qwen2MoE's layer (rnd1, llada-moe): per-head q/k norms, the router, experts stacked per layer (E, out, in)
_MOE_BLOCK = {"attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
              "ffn_gate_inp.weight": "mlp.gate.weight"}
_EXPERTS = {f"ffn_{x}_exps.weight": f"mlp.experts.{{e}}.{x}_proj.weight" for x in ("gate", "up", "down")}

ARCHS = {
    "llada": Arch("llada",
                  {"token_embd.weight": "model.transformer.wte.weight", "output_norm.weight": "model.transformer.ln_f.weight",
                   "output.weight": "model.transformer.ff_out.weight"},
                  {"attn_norm.weight": "attn_norm.weight", "attn_q.weight": "q_proj.weight", "attn_k.weight": "k_proj.weight",
                   "attn_v.weight": "v_proj.weight", "attn_q.bias": "q_proj.bias", "attn_k.bias": "k_proj.bias",
                   "attn_v.bias": "v_proj.bias", "attn_output.weight": "attn_out.weight", "ffn_norm.weight": "ff_norm.weight",
                   "ffn_gate.weight": "ff_proj.weight", "ffn_up.weight": "up_proj.weight", "ffn_down.weight": "ff_out.weight"},
                  "model.transformer.blocks", shifted=False,
                  # conversion/llada.py: undo_permute, for llama.cpp's "normal" rope (pairs 2i, 2i+1)
                  permuted={"q_proj": "n_heads", "k_proj": "n_kv_heads"}),
    # conversion/dream.py: TextModel's tensors as they are (Qwen2 rope is NEOX, rotate-half: no permutation)
    "dream": Arch("dream", _QWEN_GLOBALS, {**_QWEN_BLOCK, **_MLP}, "model.layers", shifted=True),
    # conversion/qwen.py RND1Model(Qwen2MoeModel): experts stacked per layer into 3-D tensors, NEOX rope
    "rnd1": Arch("rnd1", _QWEN_GLOBALS, {**_QWEN_BLOCK, **_MOE_BLOCK}, "model.layers", shifted=True, experts=_EXPERTS),
    # conversion/llada.py LLaDAMoEModel(TextModel): Qwen2MoE's expert merge, no permutation (NEOX rope);
    # llama.cpp's llada-moe reads no attention bias and no dense or shared MLP: a file with one is refused
    "llada-moe": Arch("llada-moe", _QWEN_GLOBALS,
                      {**{k: v for k, v in _QWEN_BLOCK.items() if not k.endswith(".bias")}, **_MOE_BLOCK},
                      "model.layers", shifted=False, experts=_EXPERTS),
}
NOT_YET = ()          # diffusion architectures llama.cpp writes that fastdllm does not read from GGUF yet


def arch_of(f) -> Arch:
    if f.arch not in ARCHS:
        what = "not read by fastdllm yet" if f.arch in NOT_YET else "not a diffusion architecture fastdllm reads"
        raise UserError(f"{f.path.name}: GGUF architecture {f.arch!r} is {what} (it reads: {', '.join(ARCHS)})")
    return ARCHS[f.arch]


def specials(f) -> dict:
    """Mask, eos, pad from the file: the ids decoding needs, never constants."""
    mask, eos = f.value("tokenizer.ggml.mask_token_id"), f.value("tokenizer.ggml.eos_token_id")
    if mask is None:
        raise UserError(f"{f.path.name} declares no mask token (tokenizer.ggml.mask_token_id), which decoding needs")
    if eos is None:
        raise UserError(f"{f.path.name} declares no end-of-text token (tokenizer.ggml.eos_token_id), which decoding needs")
    return {"mask_token_id": int(mask), "eos_token_id": int(eos),
            "pad_token_id": int(f.value("tokenizer.ggml.padding_token_id", eos))}


def decimal(value) -> float:
    """A float32 metadata value as the decimal the converter was given (1e-06, not 9.99999997e-07):
    GGUF stores these keys as float32, and the shortest repr of a float32 recovers the decimal."""
    import numpy as np

    return float(str(np.float32(value)))


def check_common(f, arch: Arch, head_dim: int) -> None:
    """What every family here has: full rotary dims, no rope scaling, bidirectional attention, and
    the family's logit shift (llama.cpp's diffusion CLI shifts where the key is absent)."""
    if (rope := f.hparam("rope.dimension_count", head_dim)) != head_dim:
        raise UserError(f"{f.path.name}: rotary dimensions {rope} differ from the head size {head_dim}; "
                        f"fastdllm's {arch.name} rotates every dimension")
    if f.hparam("rope.scaling.type", "none") not in ("none", None):
        raise UserError(f"{f.path.name}: rope scaling {f.hparam('rope.scaling.type')!r}; {arch.name} has none")
    if f.hparam("attention.causal"):
        raise UserError(f"{f.path.name} says causal attention; {arch.name} attends both ways")
    if bool(f.value("diffusion.shift_logits", arch.shifted)) != arch.shifted:
        raise UserError(f"{f.path.name}: diffusion.shift_logits {not arch.shifted}; {arch.name} "
                        f"{'predicts from the previous position' if arch.shifted else 'predicts at the same position'}")
    if isinstance(f.hparam("attention.head_count_kv"), list):
        raise UserError(f"{f.path.name}: per-layer {arch.name}.attention.head_count_kv; fastdllm takes one count")


def qwen_config(f, arch: Arch, by_name: dict, base: dict) -> dict:
    """A Qwen-layout family's published config.json (`base`) with the file's sizes and ids
    (conversion/base.py TextModel.set_gguf_parameters: hidden_size -> embedding_length, ...)."""
    n_heads = int(f.require(f"{arch.name}.attention.head_count"))
    hidden = int(f.require(f"{arch.name}.embedding_length"))
    head_dim = int(f.hparam("attention.key_length", hidden // n_heads))
    check_common(f, arch, head_dim)
    embed = by_name.get("model.embed_tokens.weight")
    if embed is None:
        raise UserError(f"{f.path.name} has no token_embd.weight tensor")
    layers = int(f.require(f"{arch.name}.block_count"))
    config = {**base, "hidden_size": hidden, "num_attention_heads": n_heads,
              "num_key_value_heads": int(f.hparam("attention.head_count_kv", n_heads)),
              "num_hidden_layers": layers, "intermediate_size": int(f.require(f"{arch.name}.feed_forward_length")),
              "max_position_embeddings": int(f.require(f"{arch.name}.context_length")),
              "rms_norm_eps": decimal(f.require(f"{arch.name}.attention.layer_norm_rms_epsilon")),
              "rope_theta": decimal(f.hparam("rope.freq_base", 10000.0)), "vocab_size": embed.shape[0],
              "tie_word_embeddings": "lm_head.weight" not in by_name, "torch_dtype": "float32", **specials(f)}
    if "max_window_layers" in base:
        config["max_window_layers"] = layers
    return config


def dream_config(f, arch: Arch, by_name: dict) -> dict:
    base = json.loads((PUBLISHED / "Dream-v0-Instruct-7B" / "config.json").read_text())
    base.pop("_name_or_path", None)
    config = qwen_config(f, arch, by_name, base)
    if (bos := f.value("tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = int(bos)
    return config


def rnd1_config(f, arch: Arch, by_name: dict) -> dict:
    base = rnd1_published_config()
    config = qwen_config(f, arch, by_name, base)
    n_heads = config["num_attention_heads"]
    config.update(head_dim=int(f.hparam("attention.key_length", config["hidden_size"] // n_heads)),
                  num_experts=int(f.require("rnd1.expert_count")), num_experts_per_tok=int(f.require("rnd1.expert_used_count")),
                  moe_intermediate_size=int(f.require("rnd1.expert_feed_forward_length")))
    return config


def rnd1_published_config() -> dict:
    """RND1-Base-0910's config.json as RND1Config.to_dict() writes it (its constants, then its own keys;
    mask 151669, eos <|im_end|>, pad <|endoftext|>): the base of a GGUF file's config, the tiny writer's too."""
    return {"architectures": ["RND1"], "attention_bias": False, "attention_dropout": 0.0,
            "auto_map": {"AutoConfig": "configuration_rnd.RND1Config", "AutoModel": "modeling_rnd.RND1Model",
                         "AutoModelForMaskedLM": "modeling_rnd.RND1LM"},
            "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
            "is_causal": False, "mask_token_id": 151669, "max_position_embeddings": 40960, "max_window_layers": 48,
            "mlp_only_layers": [], "model_type": "rnd1", "moe_backend": "hf", "moe_intermediate_size": 768,
            "norm_topk_prob": True, "num_attention_heads": 32, "num_diffusion_steps": 256, "num_experts": 128,
            "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
            "output_router_logits": False, "pad_token_id": 151643, "rms_norm_eps": 1e-06, "rope_scaling": False,
            "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": False,
            "tie_word_embeddings": False, "use_cache": False, "use_sliding_window": False, "vocab_size": 151936}


def llada_moe_config(f, arch: Arch, by_name: dict) -> dict:
    """LLaDA-MoE-7B-A1B-Instruct's published config.json with the file's sizes (docs/specs/gguf.md 12):
    every layer sparse (llama.cpp's llada-moe has only expert MLPs), softmax top-k routing without
    renormalisation, no shared expert, no expert bias (the published values, kept)."""
    base = json.loads((PUBLISHED / "LLaDA-MoE-7B-A1B-Instruct" / "config.json").read_text())
    a = arch.name
    n_heads, hidden = int(f.require(f"{a}.attention.head_count")), int(f.require(f"{a}.embedding_length"))
    head_dim = hidden // n_heads                  # the family reads no head_dim key: hidden / heads
    if f.hparam("attention.key_length", head_dim) != head_dim or hidden % n_heads:
        raise UserError(f"{f.path.name}: head size {f.hparam('attention.key_length')} is not {a}.embedding_length / "
                        f"head_count ({hidden} / {n_heads}), the only one fastdllm's llada-moe has")
    check_common(f, arch, head_dim)
    # llama.cpp's llada-moe graph hard-codes softmax gating, no renormalisation, no scale: a file saying otherwise
    for key, fine, what in (("expert_gating_func", (None, 1), "another router score than softmax"),
                            ("expert_weights_norm", (None, False), "renormalised top-k weights"),
                            ("expert_weights_scale", (None, 0.0, 1.0), "scaled expert weights")):
        if f.hparam(key) not in fine:
            raise UserError(f"{f.path.name}: {a}.{key} {f.hparam(key)} asks for {what}; LLaDA-MoE has none")
    embed, experts = by_name.get("model.embed_tokens.weight"), by_name.get("model.layers.0.mlp.experts.{e}.gate_proj.weight")
    if embed is None or experts is None:
        raise UserError(f"{f.path.name} has no {'token_embd' if embed is None else 'blk.0.ffn_gate_exps'}.weight tensor")
    expert_ff = f.hparam("expert_feed_forward_length", experts.shape[1])       # llama.cpp: n_ff_exp
    if isinstance(expert_ff, list):
        raise UserError(f"{f.path.name}: per-layer {a}.expert_feed_forward_length; fastdllm takes one size")
    layers = int(f.require(f"{a}.block_count"))
    config = {**base, "hidden_size": hidden, "num_attention_heads": n_heads,
              "num_key_value_heads": int(f.hparam("attention.head_count_kv", n_heads)), "num_hidden_layers": layers,
              "moe_layer_freq": [1] * layers, "num_experts": int(f.require(f"{a}.expert_count")),
              "num_experts_per_tok": int(f.require(f"{a}.expert_used_count")), "expert_intermediate_size": int(expert_ff),
              "max_position_embeddings": int(f.require(f"{a}.context_length")),
              "rope_theta": decimal(f.hparam("rope.freq_base", 10000.0)), "vocab_size": embed.shape[0],
              "qk_layernorm": "model.layers.0.self_attn.q_norm.weight" in by_name,
              "tie_word_embeddings": "lm_head.weight" not in by_name, "torch_dtype": "float32", **specials(f)}
    if (eps := f.hparam("attention.layer_norm_rms_epsilon")) is not None:   # absent: the family's 1e-5
        config["rms_norm_eps"] = decimal(eps)
    if (bos := f.value("tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = int(bos)
    if config["mask_token_id"] >= config["vocab_size"]:       # the converter writes 156895 whatever the vocabulary
        raise UserError(f"{f.path.name}: mask token id {config['mask_token_id']} is outside its {config['vocab_size']} "
                        "token embeddings")
    return config
