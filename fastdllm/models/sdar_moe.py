"""SDAR-30B-A3B (JetLM/SDAR-30B-A3B-Chat, -Sci): `sdar_moe`, architecture `SDARMoeForCausalLM`
(docs/specs/sdar-moe.md). Dense SDAR's block-causal Qwen3 attention (sdar.py: per-head q_norm / k_norm,
explicit head_dim, no bias, blocks of `block_size` or 4, mask `<|MASK|>` from the tokenizer, no logit
shift) with Qwen3-MoE's MLP: a softmax router over `num_experts` experts, the top
`num_experts_per_tok`, renormalised to sum 1 when `norm_topk_prob`, no shared expert (moe.py). A
layer is sparse unless it is in `mlp_only_layers` or `(layer + 1) % decoder_sparse_step != 0`; a
dense layer is a SwiGLU of `intermediate_size` (the published config has none)."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from .base import DecoderStack
from .kv_cache import Span
from .layers import RMSNorm, fuse_linears, loose_span_args
from .moe import Routing, SparseMoE, SwiGLU
from .qwen import QwenAttention, attention_residual, head_dim_of
from .sdar import SDARConfig, SDARForCausalLM
from .registry import Family

# Used only where a config.json omits the key: the published SDAR-30B-A3B-Chat values for the sizes,
# Qwen3-MoE's configuration class defaults for the switches (norm_topk_prob False, no dense layers).
SDAR_MOE_DEFAULTS = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                     "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                     "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                     "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": None}


class SDARMoeConfig(SDARConfig):
    model_type = "sdar_moe"
    family_defaults = SDAR_MOE_DEFAULTS
    # norm_topk_prob, decoder_sparse_step and mlp_only_layers are read as Qwen3-MoE reads them
    # (docs/specs/sdar-moe.md 6: the engines disagree where the published config does not ask)
    reads = {*SDARConfig.reads, *SDAR_MOE_DEFAULTS}
    harmless = {*SDARConfig.harmless, "output_router_logits", "router_aux_loss_coef"}

    @property
    def routing(self) -> Routing:
        # Qwen3-MoE (transformers, SGLang, JetEngine): the gate matmul in the model dtype, softmax at fp32
        return Routing("softmax_renorm" if self.norm_topk_prob else "softmax", self.num_experts,
                       self.num_experts_per_tok, model_dtype_logits=True)

    def is_sparse(self, layer: int) -> bool:
        return (layer not in (self.mlp_only_layers or []) and bool(self.num_experts)
                and (layer + 1) % self.decoder_sparse_step == 0)

    def malformed(self) -> list[str]:
        if not isinstance(self.decoder_sparse_step, int) or self.decoder_sparse_step < 1:
            return [f"decoder_sparse_step must be a positive integer, not {self.decoder_sparse_step!r}"]
        only = self.mlp_only_layers
        if only is not None and (not isinstance(only, list) or not all(isinstance(i, int) for i in only)):
            return [f"mlp_only_layers must list layer numbers, not {only!r}"]
        found = []
        if self.num_attention_heads % self.num_key_value_heads:
            found.append(f"num_key_value_heads {self.num_key_value_heads} does not divide num_attention_heads "
                         f"{self.num_attention_heads}")
        if any(self.is_sparse(i) for i in range(self.num_hidden_layers)):
            found += self.routing.problems()
        return found


class SDARMoeDecoderLayer(nn.Module):
    """Pre-norm Qwen3 attention, then the MoE (`mlp.gate`, `mlp.experts.{j}`) or a dense `mlp`."""

    def __init__(self, cfg: SDARMoeConfig, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim_of(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = QwenAttention(cfg, bias=False, qk_norm=True)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.is_sparse(layer):
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.routing)
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def fuse(self) -> None:
        fuse_linears(self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj)
        self.mlp.fuse()

    @loose_span_args
    def forward(self, x, span: Span, layer: int, rows=None):
        x = attention_residual(self, x, span, layer, rows)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3MoeStack(DecoderStack):
    """A stack of Qwen3-MoE decoder layers under the published names: SDAR-30B-A3B, RND1 (rnd1.py)."""
    _no_split_modules: ClassVar[list[str]] = ["SDARMoeDecoderLayer"]
    published_layout = "model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight, one tensor per expert"
    cuda_graphs = False                                         # routing decides shapes on the host

    def __init__(self, config: SDARMoeConfig):
        super().__init__(config)
        self.build_stack(config, (SDARMoeDecoderLayer(config, i) for i in range(config.num_hidden_layers)))
        self.head_dim = head_dim_of(config)
        self.post_init()


class SDARMoeForCausalLM(Qwen3MoeStack):
    authors_softmax = "logits"      # SDAR's sampler (docs/specs/sdar.md 4.3)
    config_class = SDARMoeConfig
    mask_tokens = SDARForCausalLM.mask_tokens                   # no mask_token_id in the published config
    attention = SDARForCausalLM.attention                       # block-causal, block_size or 4


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"sdar_moe": Family(SDARMoeConfig, SDARMoeForCausalLM, ("SDARMoeForCausalLM",))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
DECODES = {"sdar_moe": "sdar"}          # SDAR-30B-A3B decodes as dense SDAR (docs/specs/sdar-moe.md)
NAMES = {"sdar_moe": ["SDAR"]}
