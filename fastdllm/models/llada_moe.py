"""LLaDA-MoE-7B-A1B (inclusionAI, Base / Instruct): config.json's `model_type` is `llada` as for the
dense LLaDA-8B; `architectures` (`LLaDAMoEModelLM`) tells them apart (docs/specs/llada-moe.md).

Bidirectional like LLaDA-8B (the v1 prefix / dual caches apply), no logit shift. An OLMoE-style
decoder under Llama tensor names: q/k/v/o projections, per-head RMSNorm on q and k (`qk_layernorm`),
RoPE on all head dims; then per layer a sparse MoE (softmax router, top-k without renormalisation,
moe.py) or, where `moe_layer_freq[i]` is 0, a dense SwiGLU; plus a shared expert on the layer when
`shared_expert_intermediate_size` is set. The configuration class has no usable defaults for the
sizes: those keys are required."""

from __future__ import annotations

from torch import nn

from .base import DecoderStack, FamilyConfig
from .config_guard import Switch
from .kv_cache import Span
from .layers import RMSNorm, fuse_linears
from .moe import Routing, SparseMoE, SwiGLU
from .qwen import attention_residual
from .registry import Family

REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts",
            "num_experts_per_tok", "expert_intermediate_size", "moe_layer_freq", "rope_theta", "partial_rotary_factor")
OPTIONAL = dict(num_key_value_heads=None, dense_intermediate_size=None, shared_expert_intermediate_size=None,
                max_position_embeddings=4096, rms_norm_eps=1e-5, attention_bias=False, clip_qkv=None,
                qk_layernorm=None, moe_router_enable_expert_bias=None, moe_router_score_function=None,
                routed_scaling_factor=1, router_num_group=None, router_topk_group=None, norm_topk_prob=None,
                hidden_act="silu", mask_token_id=None, initializer_range=0.02)
_UNSET_GROUP = (None, -2)   # -2: the configuration class's "no groups" default


class LLaDAMoEConfig(FamilyConfig):
    model_type = "llada"

    def __init__(self, tie_word_embeddings: bool = False, **kwargs):
        for key, default in {**dict.fromkeys(REQUIRED), **OPTIONAL}.items():
            setattr(self, key, kwargs.pop(key, default))
        self.scaled_rope = kwargs.pop("rope_scaling", None)   # transformers 5 warns on `rope_scaling`
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        kwargs.pop("head_dim", None)                           # not read by the reference: hidden / heads
        self.head_dim = self.hidden_size // self.num_attention_heads if self.hidden_size and self.num_attention_heads else None
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def routing(self) -> Routing:
        return Routing("softmax", self.num_experts, self.num_experts_per_tok)

    def is_sparse(self, layer: int) -> bool:
        return bool(self.moe_layer_freq[layer])

    # The checkpoint's configuration_lladamoe.py / modeling_lladamoe.py (docs/specs/config-guard.md 2). The
    # last four the reference ignores, but their intent it cannot honour: refused, not diverged from.
    switches = (
        Switch("hidden_act", ("silu",), "another activation in every MLP"),
        Switch("clip_qkv", (None,), "q, k and v clamped"),
        Switch("rope_scaling", (None,), "a scaled rotary embedding (transformers' rope_type)"),
        Switch("routed_scaling_factor", (None, 1), "scaled expert weights"),
        Switch("router_num_group", _UNSET_GROUP, "group-limited routing"),
        Switch("router_topk_group", _UNSET_GROUP, "group-limited routing"),
        Switch("moe_router_score_function", (None, "softmax"), "another router score"),
    )
    reads = {*REQUIRED, *OPTIONAL, "tie_word_embeddings", "head_dim", "eos_token_id", "pad_token_id",
             "bos_token_id"} - {"clip_qkv", "routed_scaling_factor", "router_num_group", "router_topk_group",
                                "moe_router_score_function"}
    harmless = {"router_aux_loss_coef", "output_router_logits"}

    def malformed(self) -> list[str]:
        missing = [key for key in REQUIRED if getattr(self, key) in (None, -1)]
        if missing:
            return [f"required keys missing: {', '.join(missing)}"]
        freq = self.moe_layer_freq
        if not isinstance(freq, list) or len(freq) < self.num_hidden_layers:
            return [f"moe_layer_freq must list 0 or 1 for each of the {self.num_hidden_layers} layers"]
        found = [] if all(map(self.is_sparse, range(self.num_hidden_layers))) or self.dense_intermediate_size \
            else ["dense_intermediate_size is required (moe_layer_freq has dense layers)"]
        if self.num_attention_heads % self.num_key_value_heads:
            found.append(f"num_key_value_heads {self.num_key_value_heads} does not divide num_attention_heads "
                         f"{self.num_attention_heads}")
        return found + self.routing.problems()


class LLaDAMoEAttention(nn.Module):
    def __init__(self, cfg: LLaDAMoEConfig):
        super().__init__()
        d, hd, bias = cfg.hidden_size, cfg.head_dim, bool(cfg.attention_bias)
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_layernorm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_layernorm else None


class LLaDAMoEDecoderLayer(nn.Module):
    def __init__(self, cfg: LLaDAMoEConfig, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LLaDAMoEAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.is_sparse(layer):
            self.mlp = SparseMoE(cfg.hidden_size, cfg.expert_intermediate_size, cfg.routing,
                                 expert_bias="mlp" if cfg.moe_router_enable_expert_bias else None)
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.dense_intermediate_size)
        self.shared_expert = (SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)   # on the layer, not under mlp
                              if cfg.shared_expert_intermediate_size else None)

    def fuse(self) -> None:
        fuse_linears(self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj)
        self.mlp.fuse()
        if self.shared_expert is not None:
            self.shared_expert.fuse()

    def forward(self, x, span: Span, layer: int, rows=None):
        x = attention_residual(self, x, span, layer, rows)
        m = self.post_attention_layernorm(x)
        y = self.mlp(m)
        if self.shared_expert is not None:
            y = y + self.shared_expert(m)
        return x + y


class LLaDAMoEModelLM(DecoderStack):
    authors_softmax = "logits"      # the card's softmax of the uncast logits (docs/specs/llada-moe.md Q3)
    config_class = LLaDAMoEConfig
    _no_split_modules = ["LLaDAMoEDecoderLayer"]
    _keep_in_fp32_modules_strict = ["expert_bias"]
    mask_fallback = 156895                          # the model card's generate(mask_id=...); no config key
    published_layout = "model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight, one tensor per expert"
    cuda_graphs = False                             # routing decides shapes on the host

    def __init__(self, config: LLaDAMoEConfig):
        super().__init__(config)
        self.build_stack(config, (LLaDAMoEDecoderLayer(config, i) for i in range(config.num_hidden_layers)))
        self.head_dim = config.head_dim
        self.rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        self.post_init()


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"llada": Family(LLaDAMoEConfig, LLaDAMoEModelLM, ("LLaDAMoEModelLM", "LLaDAMoEModel"))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
DECODES = {"LLaDAMoEModelLM": {"profile": "llada-moe",
                               "fixed": {"block_len": 32, "rule": "threshold", "threshold": 0.9, "cache": "dual"}},
           "LLaDAMoEModel": "LLaDAMoEModelLM"}
NAMES = {"llada": ["LLaDA-MoE"]}
