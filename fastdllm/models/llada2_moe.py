"""LLaDA2.x (inclusionAI/LLaDA2.0-mini, LLaDA2.1-mini, the flash variants): `llada2_moe`, also
shipped as `bailing_moe_v2`, architecture `LLaDA2MoeModelLM` (docs/specs/llada2-moe.md).

A Ling-2.0 mixture-of-experts decoder trained for block diffusion: block-causal attention in
blocks of 32 (no config key: the authors' code), no logit shift. Per layer: fused `query_key_value`
(q heads, then k, then v), per-head RMSNorm on q and k before a partial rotary embedding (the first
`head_dim * partial_rotary_factor` dims), GQA; then a dense SwiGLU for the first
`first_k_dense_replace` layers and a sparse MoE after them (sigmoid router with a selection-only
expert bias and group limiting, moe.py) plus `num_shared_experts` shared experts.

LLaDA2.2 (same format) adds block routing when config.json has `expert_capacity`: the tokens of
one 32-position block of a row (its RoPE positions // block_size, padding apart) share a set of
`expert_capacity` experts (docs/specs/llada2-2.md §2)."""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .base import DecoderStack, FamilyConfig
from .config_guard import Switch
from .kv_cache import Span
from .layers import RMSNorm, loose_span_args, self_attention, take_rows
from .moe import Routing, SparseMoE, SwiGLU
from .registry import Family

# config.json keys and the configuration class's defaults (used only where a config omits a key)
LLADA2_KEYS = dict(vocab_size=30592, hidden_size=1024, intermediate_size=None, num_hidden_layers=24,
                   num_attention_heads=16, num_key_value_heads=0, head_dim=None, rms_norm_eps=1e-5,
                   rope_theta=10000.0, partial_rotary_factor=0.5, max_position_embeddings=16384,
                   num_experts=16, num_experts_per_tok=2, n_group=8, topk_group=4, num_shared_experts=0,
                   first_k_dense_replace=0, routed_scaling_factor=2.5, moe_intermediate_size=None,
                   use_qkv_bias=False, use_bias=True, use_qk_norm=True, norm_head=False, mask_token_id=None,
                   initializer_range=0.02, expert_capacity=None, block_size=None, delete_token_id=None,
                   split_token_id=None)


def token_id(value, raw) -> bool:
    """LLaDA2.2's edit tokens (docs/specs/llada2-2.md §3): absent, null or a token id."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def rotary_dims_agree(value, raw) -> bool:
    """rotary_dim (read by SGLang only where partial_rotary_factor is absent) must say the same."""
    heads = raw.get("num_attention_heads") or LLADA2_KEYS["num_attention_heads"]
    head_dim = raw.get("head_dim") or (raw.get("hidden_size") or LLADA2_KEYS["hidden_size"]) // heads
    fraction = raw.get("partial_rotary_factor", LLADA2_KEYS["partial_rotary_factor"])
    return value is None or value == int(head_dim * fraction)


class LLaDA2MoeConfig(FamilyConfig):
    model_type = "llada2_moe"

    def __init__(self, tie_word_embeddings: bool = False, **kwargs):
        for key, default in LLADA2_KEYS.items():
            setattr(self, key, kwargs.pop(key, default))
        self.scaled_rope = kwargs.pop("rope_scaling", None)   # transformers 5 warns on `rope_scaling`
        if not self.head_dim and self.num_attention_heads:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def routing(self) -> Routing:
        groups = self.n_group or 1
        return Routing("sigmoid_grouped", self.num_experts, self.num_experts_per_tok, groups,
                       self.topk_group or groups, float(self.routed_scaling_factor), capacity=self.expert_capacity)

    @property
    def routing_block(self) -> int | None:
        """Positions per routing block under block routing (None without it)."""
        return None if self.expert_capacity is None else (self.block_size or 32)

    def is_sparse(self, layer: int) -> bool:
        return self.num_experts is not None and layer >= self.first_k_dense_replace

    # docs/specs/config-guard.md 7: the checkpoint's modeling_llada2_moe.py, dInfer's and SGLang's ports, and
    # LLaDA2.2's additions (SGLang's block routing and InDel decoder)
    switches = (
        Switch("expert_capacity", lambda v, raw: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
               "LLaDA2.2's block routing: each block keeps expert_capacity experts"),
        Switch("block_size", (None, 32), "a routing block other than the attention's 32"),
        Switch("delete_token_id", token_id, "LLaDA2.2's insert/delete editing"),
        Switch("split_token_id", token_id, "LLaDA2.2's insert/delete editing"),
        Switch("rope_scaling", (None,), "a scaled rotary embedding (transformers' rope_type)"),
        Switch("hidden_act", ("silu",), "another activation in every MLP"),
        Switch("norm_head", (False, None), "an L2-normalised head (SGLang)"),
        Switch("score_function", ("sigmoid", None), "softmax router scores (SGLang)"),
        Switch("router_dtype", ("fp32", None), "router logits in bf16 (SGLang)"),
        Switch("norm_topk_prob", (True, None), "expert weights not renormalised (SGLang)"),
        Switch("moe_router_enable_expert_bias", (True, None), "no expert bias (SGLang)"),
        Switch("rotary_dim", rotary_dims_agree, "a rotary width other than head_dim * partial_rotary_factor"),
        Switch("use_sliding_window", (False, None), "sliding-window attention"),
        Switch("using_split_qkv_in_self_attention", (False, None), "separate q, k, v projections"),
        Switch("moe_shared_expert_intermediate_size", (None,), "a shared expert of its own size (SGLang)"),
    )
    reads = {*LLADA2_KEYS, "tie_word_embeddings", "eos_token_id", "pad_token_id", "bos_token_id"}
    # sliding_window: passed to attention only under flash-attention-2, which the block loop never uses
    harmless = {"embedding_dropout", "output_dropout", "output_router_logits", "max_window_layers",
                "norm_softmax", "use_rmsnorm", "sliding_window"}

    def malformed(self) -> list[str]:
        if not self.num_key_value_heads:
            return ["num_key_value_heads is required (the configuration class's default 0 cannot work)"]
        if self.num_attention_heads % self.num_key_value_heads:
            return [f"num_key_value_heads {self.num_key_value_heads} does not divide num_attention_heads "
                    f"{self.num_attention_heads}"]
        layers = range(self.num_hidden_layers)
        found = [f"{key} is required" for key, needed in [
            ("intermediate_size", not all(self.is_sparse(i) for i in layers)),
            ("moe_intermediate_size", any(self.is_sparse(i) for i in layers))] if needed and not getattr(self, key)]
        if self.expert_capacity is not None and self.num_experts is None:
            found.append("expert_capacity needs num_experts (block routing picks among the routed experts)")
        return found + (self.routing.problems() if self.num_experts is not None else [])


class LLaDA2Attention(nn.Module):
    def __init__(self, cfg: LLaDA2MoeConfig):
        super().__init__()
        H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, (H + 2 * KV) * hd, bias=cfg.use_qkv_bias)
        qk_norm = cfg.use_qk_norm is not False     # absent from the published configs: on
        self.query_layernorm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None
        self.key_layernorm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None
        self.dense = nn.Linear(H * hd, cfg.hidden_size, bias=cfg.use_bias)


class LLaDA2DecoderLayer(nn.Module):
    def __init__(self, cfg: LLaDA2MoeConfig, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_sizes = [self.n_heads * self.head_dim] + [self.n_kv_heads * self.head_dim] * 2
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = LLaDA2Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.routing_block = cfg.routing_block if cfg.is_sparse(layer) else None
        if cfg.is_sparse(layer):
            shared = (cfg.num_shared_experts or 0) * cfg.moe_intermediate_size
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.routing, expert_bias="gate",
                                 shared=shared or None)
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def fuse(self) -> None:
        self.mlp.fuse()                             # q/k/v are one matrix in the checkpoint already

    @loose_span_args
    def forward(self, x, span: Span, layer: int, rows=None):
        a = self.attention
        blocks, wanted = None, rows
        if self.routing_block:             # a block's experts depend on all its tokens: no row subset
            blocks, rows = routing_blocks(span.cache, span.start, x.shape[1], self.routing_block), None
        x = take_rows(x, rows) + self_attention(
            self.input_layernorm(x), a.query_key_value, None, None, a.dense, qkv_sizes=self.qkv_sizes,
            n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, span=span, layer=layer,
            rows=rows, q_norm=a.query_layernorm, k_norm=a.key_layernorm)
        h = self.post_attention_layernorm(x)
        x = x + (self.mlp(h) if blocks is None else self.mlp(h, blocks))
        return x if wanted is None or rows is not None else take_rows(x, wanted)


def routing_blocks(cache, start, n: int, block: int) -> torch.Tensor:
    """(B, n) routing-block id of each slot of the span [start, start + n): row r's real tokens at
    RoPE position p are in block (r, p // block); its left padding in a block of its own. Ids are
    unique across rows (docs/specs/llada2-2.md §2.2)."""
    if not isinstance(start, int):
        raise ValueError("block routing needs a contiguous span of the canvas (not a position set)")
    positions = cache.positions[:, start:start + n]                               # (B, n)
    B, T = cache.positions.shape
    ids = positions // block + 1
    if cache.key_mask is not None:
        ids = ids.masked_fill(~cache.key_mask.reshape(B, T)[:, start:start + n].to(ids.device), 0)
    stride = T // block + 2
    return ids + stride * torch.arange(B, device=ids.device)[:, None]


class LLaDA2MoeModelLM(DecoderStack):
    embed_name = "word_embeddings"
    config_class = LLaDA2MoeConfig
    _no_split_modules = ["LLaDA2DecoderLayer"]
    _keep_in_fp32_modules_strict = ["expert_bias"]   # selection bias: fp32 as in dInfer (lossless for bf16)
    attention = Attention("block-causal", 32)         # H1's generate and the SFT config: blocks of 32
    mask_fallback = 156895                            # H1's generate(mask_id=...); config.json has none
    published_layout = "model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight, one tensor per expert"
    cuda_graphs = False                               # routing decides shapes on the host

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        self.build_stack(config, (LLaDA2DecoderLayer(config, i) for i in range(config.num_hidden_layers)))
        self.head_dim = config.head_dim
        self.rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        self.post_init()

    @property
    def routing_block(self) -> int | None:
        """Block routing's block size where a layer routes by blocks (LLaDA2.2), else None."""
        return next((block.routing_block for block in self.blocks if block.routing_block), None)


class BailingMoeV2Config(LLaDA2MoeConfig):
    """The same configuration under the model_type dInfer also ships it as (Ling-2.0's autoregressive
    models use it too, with other `architectures`: those are refused)."""
    model_type = "bailing_moe_v2"

    def __init__(self, **kwargs):
        # use_qk_norm: dInfer's class says False, but its modeling applies the norms whatever the key
        # says (the test is commented out): absent means on, as in the checkpoint's own code
        super().__init__(**kwargs)


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"llada2_moe": Family(LLaDA2MoeConfig, LLaDA2MoeModelLM, ("LLaDA2MoeModelLM",)),
          "bailing_moe_v2": Family(BailingMoeV2Config, LLaDA2MoeModelLM, ("LLaDA2MoeModelLM",))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
# H1's generate: blocks of 32, > 0.95, at least 1 of 32 steps; with LLaDA2.2's edit tokens in config.json
# the profile is llada2.2 (its InDel decoder: decode/family_defaults.py, docs/specs/llada2-2.md)
DECODES = {"llada2_moe": {"profile": "llada2",
                          "fixed": {"block_len": 32, "rule": "dynamic", "threshold": 0.95, "cache": "prefix"}},
           "bailing_moe_v2": "llada2_moe"}
NAMES = {"llada2_moe": ["LLaDA2.x"]}
