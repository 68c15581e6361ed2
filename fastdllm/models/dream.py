"""Dream-v0 (Base, Instruct), Dream-Coder and DiffuCoder: Qwen2 config keys and tensor names.

Dream was adapted from an autoregressive Qwen2.5, so the token at position p is predicted from the
hidden state at p - 1 (`logit_shift = 1`). The engine never sees this: it asks for logits at canvas
positions and `forward_span` widens the span by one slot on the left when needed."""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from .base import DiffusionLM
from .layers import RMSNorm, fuse_linears, self_attention, swiglu, take_rows


class DreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(self, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, hidden_act="silu",
                 max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
                 mask_token_id=151666, tie_word_embeddings=False, initializer_range=0.02, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.hidden_act, self.max_position_embeddings = hidden_act, max_position_embeddings
        self.rms_norm_eps, self.rope_theta = rms_norm_eps, rope_theta
        self.scaled_rope = rope_scaling  # not `rope_scaling`: transformers 5 warns on that attribute
        self.mask_token_id, self.initializer_range = mask_token_id, initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def unsupported(self) -> list[str]:
        found = []
        if self.hidden_act != "silu":
            found.append(f"hidden_act={self.hidden_act!r}")
        if self.scaled_rope:
            found.append(f"rope_scaling={self.scaled_rope!r}")
        if getattr(self, "use_sliding_window", False):
            found.append("use_sliding_window=True")
        return found


class DreamAttention(nn.Module):
    def __init__(self, cfg: DreamConfig):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=True)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=True)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)


class DreamMLP(nn.Module):
    def __init__(self, cfg: DreamConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class DreamDecoderLayer(nn.Module):
    def __init__(self, cfg: DreamConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DreamAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DreamMLP(cfg)

    def fuse(self) -> None:
        fuse_linears(self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj)
        fuse_linears(self.mlp.gate_proj, self.mlp.up_proj)

    def forward(self, x, cos, sin, key_mask, cache, layer: int, start: int, rows=None):
        a = self.self_attn
        x = take_rows(x, rows) + self_attention(self.input_layernorm(x), a.q_proj, a.k_proj, a.v_proj, a.o_proj,
                               n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                               cos=cos, sin=sin, key_mask=key_mask, cache=cache, layer=layer, start=start,
                               rows=rows)
        m = self.mlp
        return x + swiglu(self.post_attention_layernorm(x), m.gate_proj, m.up_proj, m.down_proj)


class DreamModel(DiffusionLM):
    config_class = DreamConfig
    _no_split_modules = ["DreamDecoderLayer"]
    logit_shift = 1

    def __init__(self, config: DreamConfig):
        super().__init__(config)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList(DreamDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.rope_theta = config.hidden_size // config.num_attention_heads, config.rope_theta
        self.post_init()

    @property
    def embed(self):
        return self.model.embed_tokens

    @property
    def blocks(self):
        return self.model.layers

    @property
    def final_norm(self):
        return self.model.norm

    @property
    def output_head(self):
        return getattr(self, "lm_head", None)
