"""RND1 (radicalnumerics/RND1-Base-0910): `rnd1`, architecture `RND1` (the published config.json, as
llama.cpp's converter reads it) or `RND1LM` (the authors' class name), docs/specs/rnd1.md.

Qwen3-MoE (30B-A3B) turned into a masked diffusion model: the Qwen3 layers of sdar_moe.py (q_norm /
k_norm, explicit head_dim, no bias; every MLP a softmax router over 128 experts, the top 8
renormalised, bf16 router logits) with fully bidirectional attention and, like Dream, logits shifted
by one (position p is predicted from the hidden state at p - 1). Untied lm_head; mask id 151669.

What fastdllm trusts (docs/specs/rnd1.md §2): the authors' configuration class overwrites config.json with
Qwen3-30B-A3B constants. Sizes come from config.json (checked against the tensors when loading), the
constants fill the keys it omits; a config.json that sets one of the behaviour switches the authors
force (no tensor shows them) to another value is refused in one line, so every checkpoint we accept
runs here as the authors' code runs it."""

from __future__ import annotations

from typing import ClassVar

from .sdar import SDARConfig
from .sdar_moe import Qwen3MoeStack, SDARMoeConfig
from .registry import Family

# The authors' constants (configuration_rnd.py): sizes, used where config.json omits a key.
RND1_SIZES = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 768, "max_position_embeddings": 40960}
# The switches the authors force whatever config.json says; no tensor shows them, so a config.json
# that disagrees cannot be run as the authors run it: refused (key -> the authors' value).
RND1_FORCED = {"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1000000.0,
               "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
MASK_ID = 151669                  # config.json's mask_token_id; the Qwen3 tokenizer names no token there


class RND1Config(SDARMoeConfig):
    model_type = "rnd1"
    family_defaults: ClassVar[dict] = {**RND1_SIZES, **RND1_FORCED, "mask_token_id": MASK_ID}
    # docs/specs/config-guard.md 8: every other key its configuration class overwrites (RND1_FORCED: refused
    # when they disagree, see malformed); moe_backend picks kernels of the same math
    switches = SDARConfig.switches
    reads = {*SDARMoeConfig.reads, *RND1_SIZES, *RND1_FORCED, "num_diffusion_steps"}
    harmless = {*SDARMoeConfig.harmless, "moe_backend", "is_causal"}

    def malformed(self) -> list[str]:
        forced = [f"{key} {getattr(self, key)!r} (RND1's configuration class always uses {value!r})"
                  for key, value in RND1_FORCED.items() if getattr(self, key) != value]
        return forced or super().malformed()


class RND1LM(Qwen3MoeStack):
    # the attention kind is the class default (bidirectional): the layer itself has no mask
    config_class = RND1Config
    logit_shift = 1                               # Dream's shift: the sampler reads logits at p - 1
    mask_fallback = MASK_ID                       # a config.json without mask_token_id: the authors' default


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"rnd1": Family(RND1Config, RND1LM, ("RND1", "RND1LM"))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
# RND1's diffusion_sample (docs/specs/rnd1.md 5): one global canvas (the rule sets block_len to gen_len),
# its entropy schedule over num_diffusion_steps steps, no cache (the reference recomputes the whole
# canvas every step)
DECODES = {"rnd1": {"profile": "rnd1",
                    "fixed": {"gen_len": 256, "rule": "entropy_schedule", "confidence": "entropy", "cache": "none"},
                    "from_config": {"steps": ["num_diffusion_steps", 256]}}}
NAMES = {"rnd1": ["RND1"]}
