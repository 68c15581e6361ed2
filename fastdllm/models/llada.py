"""LLaDA-8B (Base, Instruct) and LLaDA-1.5: config keys and tensor names as published
(`model.transformer.blocks.N.q_proj.weight`, ...). Logits at the same position (no shift)."""

from __future__ import annotations

from torch import nn

from .base import DiffusionLM, FamilyConfig
from .config_guard import Switch
from .kv_cache import Span
from .layers import RMSNorm, fuse_linears, project_values, self_attention, swiglu, take_rows
from .registry import Family


class LLaDAConfig(FamilyConfig):
    model_type = "llada"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers",
                     "num_attention_heads": "n_heads", "max_position_embeddings": "max_sequence_length"}

    def __init__(self, d_model=4096, n_heads=32, n_kv_heads=None, n_layers=32, mlp_hidden_size=12288,
                 vocab_size=126464, embedding_size=126464, max_sequence_length=4096, rope_theta=10000.0,
                 rms_norm_eps=1e-5, mask_token_id=126336, weight_tying=False, include_bias=False,
                 include_qkv_bias=False, activation_type="silu", block_type="llama", layer_norm_type="rms",
                 rope=True, alibi=False, attention_layer_norm=False, scale_logits=False,
                 input_emb_norm=False, init_std=0.02, **kwargs):
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.n_kv_heads = n_kv_heads or n_heads
        self.mlp_hidden_size, self.vocab_size, self.embedding_size = mlp_hidden_size, vocab_size, embedding_size or vocab_size
        self.max_sequence_length, self.rope_theta, self.rms_norm_eps = max_sequence_length, rope_theta, rms_norm_eps
        self.mask_token_id, self.weight_tying = mask_token_id, weight_tying
        self.include_bias, self.include_qkv_bias = include_bias, include_qkv_bias
        self.activation_type, self.block_type, self.layer_norm_type = activation_type, block_type, layer_norm_type
        self.rope, self.alibi, self.attention_layer_norm = rope, alibi, attention_layer_norm
        self.scale_logits, self.input_emb_norm, self.init_std = scale_logits, input_emb_norm, init_std
        kwargs.setdefault("tie_word_embeddings", False)  # tying is LLaDA's own `weight_tying` key
        super().__init__(**kwargs)

    # The authors' ModelConfig (OLMo's, in LLaDA's modeling_llada.py): its switches, with its own
    # defaults for a config.json that omits them (docs/specs/config-guard.md 1)
    switches = (
        Switch("block_type", ("llama",), "OLMo's other blocks: fused projections, another MLP", "sequential"),
        Switch("activation_type", ("silu",), "another MLP activation", "swiglu"),
        Switch("layer_norm_type", ("rms",), "LayerNorm or Gemma's RMSNorm instead of RMSNorm", "default"),
        Switch("layer_norm_with_affine", (True,), "norms without a weight", True),
        Switch("bias_for_layer_norm", (False, None), "biases on the norms", None),
        Switch("include_bias", (False,), "biases on every linear", False),
        Switch("rope", (True,), "no rotary embedding", False),
        Switch("alibi", (False,), "ALiBi attention biases", False),
        Switch("attention_layer_norm", (False,), "a LayerNorm over q and k", False),
        Switch("scale_logits", (False,), "logits scaled by 1/sqrt(d_model)", False),
        Switch("input_emb_norm", (False,), "embeddings scaled by sqrt(d_model)", False),
        Switch("multi_query_attention", (False, None), "one key/value head", None),
        Switch("block_group_size", (1,), "blocks in groups", 1),
        Switch("rope_full_precision", (True,), "rotary embedding in the activations' dtype", True),
        Switch("tie_word_embeddings", (False, None), "a head tied by transformers (LLaDA ties by weight_tying)"),
    )
    reads = {"d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "vocab_size", "embedding_size",
             "max_sequence_length", "rope_theta", "rms_norm_eps", "mask_token_id", "weight_tying", "include_qkv_bias",
             "eos_token_id", "pad_token_id", "bos_token_id"}
    harmless = {"alibi_bias_max", "attention_layer_norm_with_affine", "flash_attention", "residual_dropout",
                "embedding_dropout", "init_device", "init_fn", "init_std", "init_cutoff_factor", "precision",
                "mlp_ratio"}


class LLaDABlock(nn.Module):
    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        d, hd = cfg.d_model, cfg.d_model // cfg.n_heads
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, hd
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=cfg.include_qkv_bias)
        self.k_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=cfg.include_qkv_bias)
        self.v_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=cfg.include_qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)   # gate (through SiLU)
        self.up_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, d, bias=False)    # down

    def fuse(self) -> None:
        fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        fuse_linears(self.ff_proj, self.up_proj)

    def forward(self, x, span: Span, layer: int, rows=None):
        x = take_rows(x, rows) + self.attend(self.attn_norm(x), span, layer, rows)
        return x + self.ffn(x)

    def attend(self, h, span: Span, layer: int, rows=None):
        """Self-attention of the normed span (or position set) h, its K/V stored in the cache."""
        return self_attention(h, self.q_proj, self.k_proj, self.v_proj, self.attn_out, n_heads=self.n_heads,
                              n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, span=span, layer=layer, rows=rows)

    def ffn(self, x):
        return swiglu(self.ff_norm(x), self.ff_proj, self.up_proj, self.ff_out)

    def values(self, h):
        """V alone (B, S, H_kv * D) of the normed h (dLLM-Cache's similarity test)."""
        return project_values(h, self.q_proj, self.k_proj, self.v_proj)


class LLaDAModelLM(DiffusionLM):
    config_class = LLaDAConfig
    _no_split_modules = ["LLaDABlock"]
    feature_cache = True     # its block hosts dLLM-Cache's layer (models/feature_cache.py)
    head_name = "model.transformer.ff_out"

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        t = nn.Module()
        t.wte = nn.Embedding(config.embedding_size, config.d_model)
        t.blocks = nn.ModuleList(LLaDABlock(config) for _ in range(config.n_layers))
        t.ln_f = RMSNorm(config.d_model, config.rms_norm_eps)
        t.ff_out = None if config.weight_tying else nn.Linear(config.d_model, config.embedding_size, bias=False)
        self.model = nn.Module()
        self.model.transformer = t
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim, self.rope_theta = config.d_model // config.n_heads, config.rope_theta
        self.post_init()

    @property
    def embed(self):
        return self.model.transformer.wte

    @property
    def blocks(self):
        return self.model.transformer.blocks

    @property
    def final_norm(self):
        return self.model.transformer.ln_f


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"llada": Family(LLaDAConfig, LLaDAModelLM, ("LLaDAModelLM",))}

# what its checkpoints are called (models/registry.py)
NAMES = {"llada": ["LLaDA"]}
