"""Steerling-8B (Guide Labs, `steerling`, architecture SteerlingForCausalLM): config keys and tensor
names of the Hub layout (docs/specs/steerling.md 1, 1.1). A block-causal masked-diffusion transformer:
causal across the absolute grid of `diff_block_size` positions, bidirectional inside one; post-norm
residuals (`x + ln_1(attn(x))`, OLMo-2 style), per-head QK RMSNorm, q/k/v clamped to +-clip_qkv,
RoPE, SwiGLU whose fused c_fc holds up first and gate second, tied head. No logit shift.

The concept heads on top of ln_f cancel exactly in unsteered decoding (epsilon correction:
composed = hidden, docs/specs/steerling.md 4), so only the backbone and the tied head are loaded; the
head tensors in the checkpoint are left unread. Precision points are the authors' for every dtype
(docs 3, D2): RMSNorm normalises in fp32 (even from fp64) and multiplies by the weight before the
cast; RoPE tables and the rotation in fp32.

The decoder is decode/steerling.py (prompt-aligned blocks, the authors' sampling): `sampler`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import MaskedLMOutput

from .attention import Attention
from .base import DiffusionLM, FamilyConfig
from .config_guard import Switch
from .layers import linear
from .registry import Family

CONCEPT_KEYS = ("n_concepts", "n_unknown_concepts", "concept_dim", "use_attention_known", "use_attention_unknown",
                "topk_known", "topk_known_features", "unknown_topk", "use_unknown", "apply_topk_to_unknown",
                "topk_on_logits", "factorize_unknown", "factorize_rank", "concept_block_size", "pad_multiple",
                "store_unknown_weights", "inject_layer", "inject_alpha", "max_concepts")


class SteerlingConfig(FamilyConfig):
    model_type = "steerling"
    attribute_map = {"hidden_size": "n_embd", "num_hidden_layers": "n_layers", "num_attention_heads": "n_head",
                     "num_key_value_heads": "n_kv_heads", "max_position_embeddings": "block_size"}

    def __init__(self, vocab_size=100281, n_layers=32, n_head=32, n_embd=4096, n_kv_heads=4, block_size=4096,
                 diff_block_size=64, norm_eps=1e-5, rope_base=500000.0, clip_qkv=10.0, mlp_ratio=4,
                 intermediate_size=None, weight_sharing=True, mask_token_id=100280, endofchunk_token_id=100279,
                 interpretable=False, **kwargs):
        self.vocab_size, self.n_layers, self.n_head, self.n_embd = vocab_size, n_layers, n_head, n_embd
        self.n_kv_heads = n_kv_heads or n_head
        self.head_dim = n_embd // n_head                # no key of its own: n_embd / n_head
        self.block_size, self.diff_block_size, self.norm_eps = block_size, diff_block_size, norm_eps
        self.rope_base, self.clip_qkv, self.weight_sharing = rope_base, clip_qkv, weight_sharing
        self.intermediate_size = intermediate_size or mlp_ratio * n_embd
        self.mlp_ratio, self.interpretable = mlp_ratio, interpretable
        self.mask_token_id, self.endofchunk_token_id = mask_token_id, endofchunk_token_id
        kwargs["tie_word_embeddings"] = False          # tying is Steerling's own `weight_sharing` key
        super().__init__(**kwargs)

    # CausalDiffusionConfig's and ConceptConfig's switches (steerling 0.2.0), with their defaults
    switches = (
        Switch("use_rms_norm", (True,), "LayerNorm with bias everywhere instead of RMSNorm"),
        Switch("norm_order", ("post",), "pre-norm residuals"),
        Switch("use_qk_norm", (True,), "no RMSNorm on q and k"),
        Switch("use_rope", (True,), "no rotary embedding"),
        Switch("rope_full_precision", (True,), "the rotation in the activations' dtype"),
        Switch("mlp_type", ("swiglu",), "a standard MLP (tanh-GELU, ReLU or SiLU)"),
        Switch("use_bias", (False,), "biases on every linear"),
        Switch("use_epsilon_correction", (True,), "concept heads that change the logits (no epsilon correction)"),
        Switch("clip_qkv", lambda v, raw: v is None or (isinstance(v, (int, float)) and v > 0), "a clamp of q/k/v"),
    )
    reads = {"vocab_size", "n_layers", "n_head", "n_embd", "n_kv_heads", "block_size", "diff_block_size", "norm_eps",
             "rope_base", "mlp_ratio", "intermediate_size", "weight_sharing", "pad_token_id", "bos_token_id",
             "eos_token_id", "mask_token_id", "endofchunk_token_id", "start_header_id", "end_header_id", "eot_id",
             "interpretable", "instruct"}
    # `activation` is read by the standard MLP only; the concept heads' keys matter for steering only
    harmless = {"activation", *CONCEPT_KEYS}


class SteerlingRMSNorm(nn.Module):
    """The authors' order: normalise in fp32 (fp64 narrows too), times the weight, then one cast."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


def rope_tables(length: int, head_dim: int, base: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, D) in fp32 for positions 0..T-1, rotate-half layout."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float) / head_dim)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D) rotated in fp32 (rope_full_precision), cast back."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class SteerlingAttention(nn.Module):
    def __init__(self, cfg: SteerlingConfig):
        super().__init__()
        d, hd = cfg.n_embd, cfg.n_embd // cfg.n_head
        self.n_head, self.n_kv, self.head_dim, self.clip = cfg.n_head, cfg.n_kv_heads, hd, cfg.clip_qkv
        self.c_attn = nn.Linear(d, d + 2 * cfg.n_kv_heads * hd, bias=False)   # rows: q (d), k, v (n_kv * hd)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.q_norm = SteerlingRMSNorm(hd, cfg.norm_eps)
        self.k_norm = SteerlingRMSNorm(hd, cfg.norm_eps)

    def forward(self, x, cos, sin, mask, cache: list, layer: int, start: int):
        """x (B, S, d) at canvas offset `start`; its K/V written into cache[layer] at [start, start+S);
        queries attend to the cache's [0, start+S) under `mask` (S, start+S)."""
        B, S, d = x.shape
        qkv = linear(x, self.c_attn)
        if self.clip is not None:
            qkv = qkv.clamp(-self.clip, self.clip)                      # before the split: q, k and v
        kv = self.n_kv * self.head_dim
        q, k, v = qkv.split([d, kv, kv], dim=-1)
        q = self.q_norm(q.reshape(B, S, self.n_head, self.head_dim).transpose(1, 2))      # (B, H, S, D)
        k = self.k_norm(k.reshape(B, S, self.n_kv, self.head_dim).transpose(1, 2))        # (B, H_kv, S, D)
        v = v.reshape(B, S, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys, values = cache[layer]
        keys[:, :, start:start + S], values[:, :, start:start + S] = k, v
        end = start + S
        y = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                                           enable_gqa=self.n_kv != self.n_head)
        return linear(y.transpose(1, 2).reshape(B, S, d), self.c_proj)


class SteerlingMLP(nn.Module):
    def __init__(self, cfg: SteerlingConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 2 * cfg.intermediate_size, bias=False)   # rows: up (I), then gate (I)
        self.c_proj = nn.Linear(cfg.intermediate_size, cfg.n_embd, bias=False)

    def forward(self, x):
        up, gate = linear(x, self.c_fc).chunk(2, dim=-1)
        return linear(F.silu(gate) * up, self.c_proj)


class SteerlingBlock(nn.Module):
    def __init__(self, cfg: SteerlingConfig):
        super().__init__()
        self.ln_1 = SteerlingRMSNorm(cfg.n_embd, cfg.norm_eps)     # on the attention's output (post-norm)
        self.attn = SteerlingAttention(cfg)
        self.ln_2 = SteerlingRMSNorm(cfg.n_embd, cfg.norm_eps)     # on the MLP's output
        self.mlp = SteerlingMLP(cfg)

    def fuse(self) -> None:
        """q/k/v and up/gate are stored fused already."""

    def forward(self, x, cos, sin, mask, cache, layer, start):
        x = x + self.ln_1(self.attn(x, cos, sin, mask, cache, layer, start))
        return x + self.ln_2(self.mlp(x))


class SteerlingForCausalLM(DiffusionLM):
    config_class = SteerlingConfig
    base_model_prefix = "steerling"
    _no_split_modules = ["SteerlingBlock"]
    sampler = "steerling"            # decode/steerling.py: generate_full's prompt-aligned blocks
    head_name = "transformer.lm_head"
    cuda_graphs = False

    def __init__(self, config: SteerlingConfig):
        super().__init__(config)
        t = nn.Module()
        t.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        t.blocks = nn.ModuleList(SteerlingBlock(config) for _ in range(config.n_layers))
        t.ln_f = SteerlingRMSNorm(config.n_embd, config.norm_eps)
        t.lm_head = None if config.weight_sharing else nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer = t
        self.n_heads, self.n_kv_heads = config.n_head, config.n_kv_heads
        self.head_dim, self.rope_theta = config.n_embd // config.n_head, config.rope_base
        self.post_init()

    @staticmethod
    def end_tokens(config: dict, tokenizer) -> tuple[int | None, list[int]]:
        """(the terminal end of turn, other stop ids) as the authors' notebooks stop: the instruct
        model at `<|eot_id|>` (terminal mid-step), the base model after a block holding
        `<|endofchunk|>`. Ids from config.json, else the tokenizer's (docs/specs/steerling.md 2, 5.4)."""
        def named(key: str, token: str) -> int | None:
            if isinstance(config.get(key), int):
                return config[key]
            i = tokenizer.convert_tokens_to_ids(token)
            return i if isinstance(i, int) and tokenizer.convert_ids_to_tokens(i) == token else None

        eot, chunk = named("eot_id", "<|eot_id|>"), named("endofchunk_token_id", "<|endofchunk|>")
        return eot, ([] if eot is not None or chunk is None else [chunk])

    @property
    def attention(self) -> Attention:
        return Attention("block-causal", int(self.config.diff_block_size))

    @property
    def embed(self):
        return self.transformer.tok_emb

    @property
    def blocks(self):
        return self.transformer.blocks

    @property
    def final_norm(self):
        return self.transformer.ln_f

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, SteerlingRMSNorm):
            nn.init.ones_(module.weight)
        else:
            super()._init_weights(module)

    # --- forwards -----------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> MaskedLMOutput:
        """Plain full forward of the canvas (no padding): logits (B, T, V) at every position."""
        B, T = input_ids.shape
        positions = torch.arange(T, device=input_ids.device).expand(B, T)
        return MaskedLMOutput(logits=self.span_logits(input_ids, 0, self.new_kv(B, T), positions))

    def new_kv(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, K and V buffers (B, H_kv, T, D) for the whole canvas."""
        w = self.embed.weight
        shape = (batch, self.n_kv_heads, length, self.head_dim)
        return [(w.new_zeros(shape), w.new_zeros(shape)) for _ in self.blocks]

    def span_logits(self, ids: torch.Tensor, start: int, cache: list, positions: torch.Tensor) -> torch.Tensor:
        """Recompute canvas span [start, start+S) of ids (B, S) against the cache (keys before
        `start` must be final); logits (B, K, V) at canvas `positions` (B, K) inside the span."""
        B, S = ids.shape
        end, block = start + S, self.config.diff_block_size
        device = ids.device
        cos, sin = rope_tables(end, self.head_dim, self.rope_theta, device)
        cos, sin = cos[start:end], sin[start:end]
        q_idx = torch.arange(start, end, device=device)[:, None] // block
        k_idx = torch.arange(end, device=device)[None, :] // block
        x = self.embed(ids)                                                   # (B, S, d)
        mask = torch.zeros(S, end, device=device, dtype=x.dtype).masked_fill_(q_idx < k_idx, float("-inf"))
        for layer, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, mask, cache, layer, start)
        h = self.final_norm(x.gather(1, (positions - start)[..., None].expand(-1, -1, x.shape[-1])))
        return self.head(h)                                                  # (B, K, V)


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"steerling": Family(SteerlingConfig, SteerlingForCausalLM, ("SteerlingForCausalLM",))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
# Steerling's generate_full (docs/specs/steerling.md 5, 7): its blocks are the attention's, one token per
# step, the authors' sampling; the prefix cache gives the same logits and NFE as their full canvas
DECODES = {"steerling": {"profile": "steerling", "fixed": {"rule": "fixed", "cache": "prefix"},
                         "from_config": {"block_len": ["diff_block_size", 64]}}}
NAMES = {"steerling": ["Steerling"]}
