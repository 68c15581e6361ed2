"""Nemotron-Labs Diffusion (`nemotron_labs_diffusion`, nvidia/Nemotron-Labs-Diffusion-3B/8B/14B;
docs/specs/nemotron-diffusion.md): a Ministral-3 (Llama) decoder under the checkpoint's names
(`encoder.*`, an untied `diffusion_head`), YaRN RoPE with transformers' attention factor and the
Llama-4 query scale after RoPE, run in two attention modes over one set of weights:

- causal (`encode`): the prompt, each finished block, AR decoding; keeps its K/V; next-token logits;
- bidirectional (`denoise`): the current block against the cached prefix; unshifted logits.

Its decoders are not the mask loop: decode/seeded.py runs them (`sampler = "seeded"`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from .attention import Attention
from .base import DiffusionLM, FamilyConfig
from .config_guard import Switch
from .kv_cache import CanvasCache, Slots, Span
from .layers import RMSNorm, at_least_fp32, linear, self_attention, swiglu, take_rows
from .qwen import QwenDecoderLayer
from .registry import Family

# the keys the forward and the decoders read, with the 8B's published values (docs §1)
KEYS = dict(vocab_size=131072, hidden_size=4096, intermediate_size=14336, num_hidden_layers=34,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
            max_position_embeddings=262144, rms_norm_eps=1e-5, rope_parameters=None, mask_token_id=100,
            block_size=32, dlm_paradigm="bidirectional", sliding_window=None)
ROPE_8B = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 16384,
           "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}


def _rope_ok(value, raw) -> bool:
    return value is None or isinstance(value, dict) and value.get("rope_type", "default") in ("default", "yarn") \
        and value.get("partial_rotary_factor", 1.0) == 1.0 and value.get("attention_factor") is None


class NemotronLabsDiffusionConfig(FamilyConfig):
    model_type = "nemotron_labs_diffusion"

    def __init__(self, tie_word_embeddings: bool = False, **kwargs):
        values = {key: kwargs.pop(key, default) for key, default in KEYS.items()}
        values["rope_parameters"] = dict(values["rope_parameters"] or ROPE_8B)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        for key, value in values.items():            # after: transformers would standardise rope_parameters
            setattr(self, key, value)

    # docs/specs/config-guard.md; docs/specs/nemotron-diffusion.md §1
    switches = (
        Switch("hidden_act", ("silu",), "another MLP activation"),
        Switch("tie_word_embeddings", (False, None), "a diffusion_head tied to the embedding"),
        Switch("dlm_paradigm", ("bidirectional", None), "another attention paradigm (autoregressive or block_diff training)"),
        Switch("rope_parameters", _rope_ok, "another rotary embedding (only default and YaRN are implemented)"),
        Switch("sliding_window", (None,), "sliding-window attention"),
        Switch("attention_bias", (False, None), "biases on q, k, v and o"),
    )
    reads = {*KEYS, "eos_token_id", "bos_token_id", "pad_token_id"}
    harmless = {"ar_loss_weight", "dlm_loss_weight", "dp_varying_mask_ratio"}     # training only


def rope_frequencies(rope: dict, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,) fp32, attention factor): transformers' default or YaRN parameters (docs §2)."""
    base, cpu = float(rope["rope_theta"]), torch.device("cpu")      # cpu: also under from_pretrained's meta device
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=cpu) / head_dim)
    if rope.get("rope_type", "default") == "default":
        return 1.0 / pos_freqs, 1.0
    factor, original = float(rope["factor"]), rope["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
    attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def dim_at(rotations: float) -> float:          # the dimension that turns `rotations` times over `original`
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_at(rope.get("beta_fast") or 32), dim_at(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float, device=cpu) - low) / (high - low)).clamp(0, 1)
    inv_freq = (1 / (factor * pos_freqs)) * ramp + (1 / pos_freqs) * (1 - ramp)
    return inv_freq, float(attention_factor)


class NemotronLayer(QwenDecoderLayer):
    """A Ministral-3 block (Qwen's names without bias or q/k norms) whose queries take a per-token scale."""

    def __init__(self, cfg):
        super().__init__(cfg, bias=False, qk_norm=False)

    def forward(self, x, span: Span, layer: int, rows=None, lora=None):
        a = self.self_attn
        o_proj = a.o_proj if lora is None else LoRA(a.o_proj, *lora)
        x = take_rows(x, rows) + self_attention(
            self.input_layernorm(x), a.q_proj, a.k_proj, a.v_proj, o_proj, n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, span=span, layer=layer, rows=rows)
        m = self.mlp
        return x + swiglu(self.post_attention_layernorm(x), m.gate_proj, m.up_proj, m.down_proj)


class LoRA(nn.Module):
    """o_proj with the self-speculation adapter added: W x + scale * B (A x) (PEFT's LoRA)."""

    def __init__(self, base: nn.Module, A: torch.Tensor, B: torch.Tensor, scale: float):
        super().__init__()
        self.base, self.A, self.B, self.scale = base, A, B, scale
        self.weight = None                  # layers.linear: not a packed weight, call forward

    def forward(self, x):
        return linear(x, self.base) + self.scale * ((x @ self.A.T) @ self.B.T)


def read_lora(folder: Path, n_layers: int, dtype: torch.dtype, device) -> list[tuple] | None:
    """`folder/linear_spec_lora` (PEFT: adapter_config.json, adapter_model.safetensors), per layer
    (A (r, in), B (out, r), alpha / r); None where the checkpoint ships none. One-line errors."""
    lora = Path(folder) / "linear_spec_lora"
    if not (lora / "adapter_config.json").is_file():
        return None
    from safetensors.torch import load_file

    c = json.loads((lora / "adapter_config.json").read_text())
    if c.get("peft_type", "LORA") != "LORA" or set(c.get("target_modules") or []) != {"o_proj"} \
            or c.get("use_dora") or c.get("use_rslora") or c.get("bias", "none") != "none":
        raise ValueError(f"{lora}: only a plain LoRA on o_proj is implemented (docs/specs/nemotron-diffusion.md 5)")
    weights = load_file(str(lora / "adapter_model.safetensors"))
    out = []
    for i in range(n_layers):
        p = f"base_model.model.encoder.layers.{i}.self_attn.o_proj."
        if p + "lora_A.weight" not in weights:
            raise ValueError(f"{lora}: no adapter for layer {i} ({p}lora_A.weight)")
        A, B = (weights[p + f"lora_{x}.weight"].to(device, dtype) for x in "AB")
        out.append((A, B, c["lora_alpha"] / c["r"]))
    return out


class NemotronLabsDiffusionModel(DiffusionLM):
    config_class = NemotronLabsDiffusionConfig
    _no_split_modules = ["NemotronLayer"]
    sampler = "seeded"                  # decode/seeded.py: causal seed, bidirectional block, causal commit
    attention = Attention("causal-encoder")
    head_name = "diffusion_head"

    def __init__(self, config: NemotronLabsDiffusionConfig):
        super().__init__(config)
        c = config
        self.encoder = nn.Module()
        self.encoder.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.encoder.layers = nn.ModuleList(NemotronLayer(c) for _ in range(c.num_hidden_layers))
        self.encoder.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.diffusion_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.n_heads, self.n_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
        rope = c.rope_parameters
        self.rope_theta = float(rope["rope_theta"])
        # plain attributes, not buffers: from_pretrained would leave non-persistent buffers uninitialised
        self.inv_freq, self.attention_factor = rope_frequencies(rope, self.head_dim)
        self.q_beta = rope.get("llama_4_scaling_beta")
        self.q_original = rope.get("original_max_position_embeddings") or c.max_position_embeddings
        self.lora: list[tuple] | None = None        # linear_spec_lora, per layer (read_files)
        self.post_init()

    def read_files(self, folder: Path) -> None:
        """After loading: the self-speculation adapter beside the weights, where the checkpoint has one."""
        self.lora = read_lora(folder, len(self.blocks), self.embed.weight.dtype, self.input_device)

    @property
    def embed(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    @property
    def blocks(self) -> nn.ModuleList:
        return self.encoder.layers

    @property
    def final_norm(self) -> RMSNorm:
        return self.encoder.norm

    # --- the two modes ---------------------------------------------------------------------------
    def encode(self, ids: torch.Tensor, start: int, cache: CanvasCache) -> torch.Tensor:
        """Causal forward over slots [start, start + S) (keeping their K/V); the logits (B, V) of
        the span's last slot: the next token."""
        last = torch.full((ids.shape[0], 1), ids.shape[1] - 1, device=ids.device)
        return self.head(self.hidden_states(ids, start, cache, last, causal=True))[:, 0]

    def encode_all(self, ids: torch.Tensor, start: int, cache: CanvasCache) -> torch.Tensor:
        """Causal forward over the span keeping its K/V; next-token logits (B, S, V) at every slot."""
        return self.head(self.hidden_states(ids, start, cache, causal=True))

    def denoise(self, ids: torch.Tensor, start: int, cache: CanvasCache, adapter: bool = False) -> torch.Tensor:
        """Bidirectional forward of the span against the prefix before `start`; logits (B, S, V),
        position i predicting i. Its K/V land in the span's slots (overwritten by the commit pass).
        `adapter`: with the self-speculation LoRA, where the checkpoint has one (drafts)."""
        return self.head(self.hidden_states(ids, start, cache, lora=self.lora if adapter else None))

    def hidden_states(self, ids: torch.Tensor, start: int | Slots, cache: CanvasCache,
                      rows: torch.Tensor | None = None, causal: bool = False, lora=None) -> torch.Tensor:
        if isinstance(start, Slots):
            raise ValueError("nemotron_labs_diffusion: no position-set forwards (cache mode dkv)")
        x = self.embed(ids)
        S = ids.shape[1]
        positions = cache.positions[:, start:start + S].to(x.device)                  # (B, S) per row
        dt = at_least_fp32(x.dtype)
        angles = positions.to(dt)[..., None] * self.inv_freq.to(x.device, dt)
        angles = torch.cat([angles, angles], -1)[:, :, None]                          # (B, S, 1, D)
        cos, sin = angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
        q_scale = None
        if self.q_beta is not None:      # 1 + beta ln(1 + floor(p / L0)), exactly 1 below L0
            q_scale = 1 + self.q_beta * torch.log1p(torch.floor(positions.to(dt) / self.q_original))
        span = Span(cache, start, cos, sin, self._mask(cache, start, S, causal, x.device), q_scale)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, span, i, rows if i == last else None, None if lora is None else lora[i])
        return self.final_norm(x)

    @staticmethod
    def _mask(cache: CanvasCache, start: int, S: int, causal: bool, device) -> torch.Tensor:
        """(B, 1, S, T) bool: the prefix before `start` and the span itself (causal: keys up to the
        query); never padding or slots after the span."""
        slot = torch.arange(cache.length, device=device)
        query = torch.arange(start, start + S, device=device)[:, None]              # (S, 1)
        allowed = (slot[None, :] < start) | ((slot[None, :] >= start) & (slot[None, :] < start + S))
        if causal:
            allowed = allowed & (slot[None, :] <= query)
        allowed = allowed.expand(S, -1)[None, None].expand(cache.positions.shape[0], 1, S, -1)
        return allowed if cache.key_mask is None else allowed & cache.key_mask.to(device)


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"nemotron_labs_diffusion": Family(NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel,
                                                   ("NemotronLabsDiffusionModel",))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
# the checkpoint's generate with the model card's block_length 32, threshold 0.9 (docs/specs/nemotron-diffusion.md 3)
DECODES = {"nemotron_labs_diffusion": {"profile": "nemotron-diffusion",
                                       "fixed": {"rule": "threshold", "threshold": 0.9, "cache": "prefix"},
                                       "from_config": {"block_len": ["block_size", 32]}}}
NAMES = {"nemotron_labs_diffusion": ["Nemotron-Labs Diffusion"]}
