"""The Qwen2 / Qwen3 decoder under the checkpoints' own tensor names (`model.embed_tokens`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, `model.norm`, `lm_head`),
shared by the families adapted from Qwen: Dream and Fast-dLLM v2 (Qwen2.5: q/k/v bias) and SDAR
(Qwen3: per-head `q_norm`/`k_norm`, explicit `head_dim`, no bias). A family file supplies the
config class and what makes it a diffusion model (mask id, logit shift, attention kind)."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from .base import DecoderStack, FamilyConfig
from .config_guard import Switch
from .kv_cache import Span
from .layers import RMSNorm, fuse_linears, loose_span_args, project_values, self_attention, swiglu, take_rows

QWEN_KEYS = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
                 max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                 mask_token_id=None, initializer_range=0.02)


class QwenConfig(FamilyConfig):
    """Qwen2/Qwen3 config keys; a family overrides `family_defaults` with its published values
    (used only for keys a config.json omits). Unknown keys are kept as attributes."""
    family_defaults: ClassVar[dict] = {}

    def __init__(self, tie_word_embeddings: bool = False, **kwargs):
        values = {**QWEN_KEYS, **self.family_defaults}
        values = {key: kwargs.pop(key, default) for key, default in values.items()}
        values["num_key_value_heads"] = values["num_key_value_heads"] or values["num_attention_heads"]
        values["scaled_rope"] = values.pop("rope_scaling")   # transformers 5 warns on `rope_scaling`
        for key, value in values.items():
            setattr(self, key, value)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def __init_subclass__(cls, **kwargs):
        # transformers turns every config class into a dataclass whose generated __init__ would
        # replace ours in a family subclass that declares none: give it ours explicitly.
        if "__init__" not in cls.__dict__:
            cls.__init__ = QwenConfig.__init__
        super().__init_subclass__(**kwargs)

    # Qwen2 / Qwen3's switches (docs/specs/config-guard.md): the families add theirs
    switches = (
        Switch("hidden_act", ("silu",), "another MLP activation"),
        Switch("rope_scaling", (None, False), "a scaled rotary embedding (transformers' rope_type)"),
        # no author applies a window (their attention ignores it); refused rather than guessed
        Switch("use_sliding_window", (False, None), "sliding-window attention"),
    )
    reads = {*QWEN_KEYS, "tie_word_embeddings", "eos_token_id", "pad_token_id", "bos_token_id"}
    harmless = {"sliding_window", "max_window_layers"}       # read only with use_sliding_window


def head_dim_of(cfg) -> int:
    """Qwen3 configs state head_dim (it need not be hidden / heads); Qwen2 derives it."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class QwenAttention(nn.Module):
    def __init__(self, cfg, *, bias: bool, qk_norm: bool):
        super().__init__()
        d, hd = cfg.hidden_size, head_dim_of(cfg)
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None      # Qwen3's per-head norms
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None


class QwenMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class QwenDecoderLayer(nn.Module):
    def __init__(self, cfg, *, bias: bool, qk_norm: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim_of(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = QwenAttention(cfg, bias=bias, qk_norm=qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = QwenMLP(cfg)

    def fuse(self) -> None:
        fuse_linears(self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj)
        fuse_linears(self.mlp.gate_proj, self.mlp.up_proj)

    @loose_span_args
    def forward(self, x, span: Span, layer: int, rows=None):
        x = attention_residual(self, x, span, layer, rows)
        return x + self.ffn(x)

    # dLLM-Cache's view of the layer (models/feature_cache.py)
    @property
    def attn_norm(self) -> RMSNorm:
        return self.input_layernorm

    def attend(self, h, span: Span, layer: int, rows=None):
        return attend(self, h, span, layer, rows)

    def ffn(self, x):
        m = self.mlp
        return swiglu(self.post_attention_layernorm(x), m.gate_proj, m.up_proj, m.down_proj)

    def values(self, h):
        a = self.self_attn
        return project_values(h, a.q_proj, a.k_proj, a.v_proj)


def attention_residual(block: nn.Module, x, span: Span, layer: int, rows=None):
    """x + attention(input_layernorm(x)) of a Qwen-style layer, at `rows` only when given."""
    return take_rows(x, rows) + attend(block, block.input_layernorm(x), span, layer, rows)


def attend(block: nn.Module, h, span: Span, layer: int, rows=None):
    """Self-attention of the normed span h of a Qwen-style layer (`self_attn.{q,k,v,o}_proj`, q/k
    norms where present; its n_heads, n_kv_heads, head_dim), its K/V stored in the cache."""
    a = block.self_attn
    return self_attention(h, a.q_proj, a.k_proj, a.v_proj, a.o_proj, n_heads=block.n_heads,
                          n_kv_heads=block.n_kv_heads, head_dim=block.head_dim, span=span, layer=layer, rows=rows,
                          q_norm=a.q_norm, k_norm=a.k_norm)


class QwenLM(DecoderStack):
    """A Qwen decoder as a diffusion LM; subclasses set `config_class`, `bias`, `qk_norm`."""
    bias = True
    qk_norm = False

    def __init__(self, config):
        super().__init__(config)
        self.build_stack(config, (QwenDecoderLayer(config, bias=self.bias, qk_norm=self.qk_norm)
                                  for _ in range(config.num_hidden_layers)))
        self.head_dim = head_dim_of(config)
        self.post_init()
