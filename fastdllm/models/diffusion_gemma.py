"""DiffusionGemma (`diffusion_gemma`, google/diffusiongemma-26B-A4B-it; docs/specs/diffusion-gemma.md):
Gemma-4's MoE backbone run in two modes over one set of weights. The causal encoder writes the
canvas K/V cache (the prompt, then each committed canvas); the decoder runs the current canvas
bidirectionally against that cache without keeping anything, and gives its logits. Decoding is not
"commit masked positions": the whole canvas is resampled every step (decode/renoise.py).

Tensor names are the checkpoint's: `model.decoder.*` (embedding, layers, norm, self-conditioning;
the head is tied to the embedding) and `model.encoder.language_model.layers.N.layer_scalar`, the
encoder's only weights of its own (it shares every other text weight with the decoder). Vision
weights (`model.encoder.vision_tower`, `model.encoder.embed_vision`) are left unread: text only."""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .base import DiffusionLM, FamilyConfig
from .config_guard import REQUIRED, Switch, number
from .gemma_layers import (
    GemmaLayer,
    GemmaRMSNorm,
    SelfConditioning,
    inv_frequencies,
    rope_tables,
)
from .kv_cache import CanvasCache, Span
from .registry import Family

# the text_config keys the forward reads, with transformers' DiffusionGemmaTextConfig defaults
TEXT_KEYS = dict(vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256, global_head_dim=512,
                 num_global_key_value_heads=None, hidden_activation="gelu_pytorch_tanh",
                 max_position_embeddings=131_072, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
                 bos_token_id=2, rope_parameters=None, attention_bias=False, sliding_window=512,
                 layer_types=None, final_logit_softcapping=30.0, use_bidirectional_attention=None,
                 num_experts=None, top_k_experts=None, moe_intermediate_size=None)
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


def positive_int(value, raw) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def plain_rope(value, raw) -> bool:
    """rope_parameters per layer kind: the default RoPE or transformers' proportional one, unscaled."""
    return value is None or isinstance(value, dict) and all(
        isinstance(rope, dict) and rope.get("rope_type") in ("default", "proportional") and rope.get("factor", 1.0) == 1.0
        for rope in value.values())


class DiffusionGemmaConfig(FamilyConfig):
    """The root config.json (`text_config`, `canvas_length`, ...) flattened: text keys become
    attributes. Layer types: the configured list, else 5 sliding to 1 full; the last layer is always
    full (as transformers forces). Full layers use `global_head_dim` and, when given,
    `num_global_key_value_heads`."""
    model_type = "diffusion_gemma"

    def __init__(self, text_config: dict | None = None, canvas_length: int = 256, image_token_id: int = 258_880,
                 tie_word_embeddings: bool = True, **kwargs):
        text = text_config.to_dict() if hasattr(text_config, "to_dict") else dict(text_config or {})
        for key, default in TEXT_KEYS.items():
            setattr(self, key, text.get(key, default))
        n = self.num_hidden_layers
        types = list(self.layer_types or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)])
        types[-1] = "full_attention"
        self.layer_types = types
        # per-layer geometry: transformers' saved `per_layer_config`, else the published keys
        overrides = text.get("per_layer_config") or {
            i: {"head_dim": self.global_head_dim, **({"num_key_value_heads": self.num_global_key_value_heads}
                                                     if self.num_global_key_value_heads else {})}
            for i, kind in enumerate(types) if kind == "full_attention"}
        self.layer_overrides = {int(i): dict(v) for i, v in overrides.items()}
        self.rope_parameters = self.rope_parameters or DEFAULT_ROPE
        self.canvas_length, self.image_token_id = canvas_length, image_token_id
        self.text_config = text
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def head_dim_of(self, layer: int) -> int:
        return self.layer_overrides.get(layer, {}).get("head_dim", self.head_dim)

    def kv_heads(self, layer: int) -> int:
        return self.layer_overrides.get(layer, {}).get("num_key_value_heads", self.num_key_value_heads)

    # docs/specs/config-guard.md 9: transformers' DiffusionGemma classes, and the Gemma-4 switches its code
    # does not read (a checkpoint that sets them is a variant even transformers would run wrongly)
    switches = (
        Switch("text_config.hidden_activation", ("gelu_pytorch_tanh",), "another activation"),
        Switch("text_config.attention_bias", (False, None), "biases on q, k, v and o"),
        Switch("text_config.use_bidirectional_attention", (None, "vision"), "a bidirectional encoder"),
        Switch("text_config.num_experts", positive_int, "a text model without experts", REQUIRED),
        Switch("text_config.top_k_experts", positive_int, "a text model without experts", REQUIRED),
        Switch("text_config.moe_intermediate_size", positive_int, "a text model without experts", REQUIRED),
        Switch("text_config.rope_parameters", plain_rope, "a scaled rotary embedding"),
        Switch("text_config.final_logit_softcapping", number, "logits without soft-capping"),
        Switch("tie_word_embeddings", (True, None), "a head of its own (lm_head)"),
        Switch("text_config.attention_k_eq_v", (True, None), "full layers with their own values"),
        Switch("text_config.enable_moe_block", (True, None), "layers without experts"),
        Switch("text_config.num_kv_shared_layers", (0, None), "layers sharing keys and values"),
        Switch("text_config.hidden_size_per_layer_input", (0, None), "per-layer input embeddings"),
        Switch("text_config.use_double_wide_mlp", (False, None), "double-wide MLPs"),
        Switch("text_config.attn_logit_softcapping", (None,), "soft-capped attention logits"),
    )
    nested = ("text_config",)
    reads = {"canvas_length", "image_token_id", "eos_token_id", "pad_token_id", "bos_token_id",
             *(f"text_config.{key}" for key in TEXT_KEYS), "text_config.per_layer_config"}
    harmless = {"boi_token_id", "eoi_token_id", "vision_config", "text_config.attention_dropout",
                "text_config.initializer_range", "text_config.model_type", "text_config.dtype",
                "text_config.vocab_size_per_layer_input", "text_config.tie_word_embeddings"}


class DiffusionGemmaForBlockDiffusion(DiffusionLM):
    config_class = DiffusionGemmaConfig
    sampler = "renoise"                 # decode/renoise.py decodes it, not the mask loop
    uses_mask = False                   # its `<mask>` (id 4) is never used: the canvas is noise, not masks
    cuda_graphs = False                 # the MoE routing sizes its matmuls on the host
    head_name = None                    # tied to the embedding (output_head None)
    # 8/4-bit: bitsandbytes quantizes nn.Linear modules, and the published experts (90% of the
    # weights) are 3-D tensors: a quantized model holds them as per-expert linears (ExpertLinears),
    # read from the shards apart (checkpoints/packed_experts.py). The router is not quantized: it
    # decides everything and is small (as in the other MoE families).
    packed_experts = r"\.experts\.(gate_up_proj|down_proj)$"
    quantize_skip = ("router.proj",)

    def __init__(self, config: DiffusionGemmaConfig):
        super().__init__(config)
        c = config
        # canvases one after another from the prompt's end, each bidirectional against the causal past
        self.attention = Attention("causal-encoder", c.canvas_length)
        self.model = nn.Module()
        self.model.decoder = nn.Module()
        dec = self.model.decoder
        dec.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        dec.layers = nn.ModuleList(GemmaLayer(c, i) for i in range(c.num_hidden_layers))
        dec.norm = GemmaRMSNorm(c.hidden_size, c.rms_norm_eps)
        dec.self_conditioning = SelfConditioning(c.hidden_size, c.intermediate_size, c.rms_norm_eps)
        self.model.encoder = nn.Module()
        self.model.encoder.language_model = nn.Module()
        self.model.encoder.language_model.layers = nn.ModuleList(_Scalar() for _ in range(c.num_hidden_layers))
        # RoPE frequencies per layer kind (fp32, as transformers computes them); plain attributes,
        # not buffers: from_pretrained would leave non-persistent buffers uninitialised
        self.inv_freq = {}
        for kind, rope in c.rope_parameters.items():
            dim = c.head_dim_of(c.layer_types.index(kind)) if kind in c.layer_types else c.head_dim
            fraction = rope.get("partial_rotary_factor", 1.0) if rope["rope_type"] == "proportional" else None
            self.inv_freq[kind] = inv_frequencies(dim, rope["rope_theta"], fraction)
        if c.experts_apart:          # read by checkpoints/packed_experts.py instead
            self._keys_to_ignore_on_load_unexpected = [*self._keys_to_ignore_on_load_unexpected, self.packed_experts]
        self.post_init()

    @property
    def embed_scale(self) -> torch.Tensor:
        """sqrt(hidden_size) as transformers keeps it: a number in the weights' dtype (bf16: 53.0
        for 2816, not 53.07)."""
        return torch.tensor(self.config.hidden_size ** 0.5, dtype=self.embed.weight.dtype)

    # --- what DiffusionLM needs ----------------------------------------------------------------
    @property
    def embed(self) -> nn.Embedding:
        return self.model.decoder.embed_tokens

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.decoder.layers

    @property
    def final_norm(self) -> GemmaRMSNorm:
        return self.model.decoder.norm

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Tied head, then the logits in fp32, soft-capped: cap * tanh(logits / cap)."""
        cap = self.config.final_logit_softcapping
        return torch.tanh(nn.functional.linear(h, self.embed.weight).float() / cap) * cap

    def new_cache(self, valid: torch.Tensor, keep_kv: bool = True, block: int | None = None) -> CanvasCache:
        c, dtype, device = self.config, self.embed.weight.dtype, self.input_device
        n = c.num_hidden_layers
        return CanvasCache.allocate(valid, layers=[(device, dtype)] * n, kv_heads=[c.kv_heads(i) for i in range(n)],
                                    head_dim=[c.head_dim_of(i) for i in range(n)], keep_kv=True, block=block)

    # vision weights may be present and are not read (anything else missing or unexpected is an error)
    _keys_to_ignore_on_load_unexpected = [r"model\.encoder\.(vision_tower|embed_vision)\."]

    # --- the two modes ---------------------------------------------------------------------------
    def encode(self, ids: torch.Tensor, start: int, cache: CanvasCache) -> None:
        """Causal encoder over canvas slots [start, start + S) (the prompt, or a committed canvas):
        writes every layer's K/V there; sliding layers see their last `sliding_window` positions."""
        x = self.embed(ids) * self.embed_scale
        scalars = [m.layer_scalar for m in self.model.encoder.language_model.layers]
        self._layers(x, start, cache, scalars, causal=True)

    def denoise(self, canvas: torch.Tensor, start: int, cache: CanvasCache,
                previous: torch.Tensor | None) -> torch.Tensor:
        """Decoder over the canvas (B, C) at slots [start, start + C), bidirectional, against the
        encoder's K/V before `start` (sliding layers: its last sliding_window - 1 positions);
        `previous`: the previous step's scaled logits (None at a canvas's first step). Returns the
        canvas's logits (B, C, V), fp32. Writes nothing that outlives the call (the canvas slots'
        K/V are overwritten when the committed canvas is encoded)."""
        weight, scale = self.embed.weight, self.embed_scale
        x = self.embed(canvas) * scale
        if previous is None:
            soft = torch.zeros_like(x)
        else:
            soft = (previous.softmax(-1, dtype=torch.float32).to(weight.dtype) @ weight) * scale.to(x.dtype)
        x = self.model.decoder.self_conditioning(x, soft)
        scalars = [layer.layer_scalar for layer in self.blocks]
        return self.head(self.final_norm(self._layers(x, start, cache, scalars, causal=False)))

    def _layers(self, x: torch.Tensor, start: int, cache: CanvasCache, scalars, *, causal: bool) -> torch.Tensor:
        S = x.shape[1]
        positions = cache.positions[:, start:start + S].to(x.device)
        spans = {kind: Span(cache, start, *rope_tables(positions, self.inv_freq[kind], x.dtype),
                            self._mask(cache, start, S, sliding=kind == "sliding_attention", causal=causal, device=x.device))
                 for kind in self.config.rope_parameters}     # one per layer kind: its RoPE and its window
        for i, (layer, scalar) in enumerate(zip(self.blocks, scalars)):
            x = layer(x, spans[self.config.layer_types[i]], i, scalar)
        return x

    def _mask(self, cache: CanvasCache, start: int, S: int, *, sliding: bool, causal: bool, device) -> torch.Tensor:
        """(B, 1, S, T) bool: what the span's queries see. Encoder: keys up to the query (sliding:
        the last `sliding_window` positions, itself included). Decoder: the whole canvas, and before
        it the cache (sliding: its last sliding_window - 1 positions). Never padding or later slots."""
        T, W = cache.length, self.config.sliding_window
        slot = torch.arange(T, device=device)
        query = torch.arange(start, start + S, device=device)[:, None]                   # (S, 1)
        if causal:
            allowed = slot[None, :] <= query
            if sliding:
                allowed = allowed & (query - slot[None, :] < W)
        else:
            before = slot < start
            if sliding:
                before = before & (slot >= start - (W - 1))
            allowed = (before | ((slot >= start) & (slot < start + S)))[None, :].expand(S, T)
        allowed = allowed[None, None]
        if cache.key_mask is not None:
            allowed = allowed & cache.key_mask.to(device)
        return allowed


class _Scalar(nn.Module):
    """An encoder layer's own weight: its output scale (every other weight is the decoder's)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"diffusion_gemma": Family(DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion,
                                   ("DiffusionGemmaForBlockDiffusion", "DiffusionGemma4ModelForBlockDiffusion"))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
# the canvas from config.json; gen_len and the sampler from generation_config.json, computed in
# decode/family_defaults.py (docs/specs/diffusion-gemma.md 1.3)
DECODES = {"diffusion_gemma": {"profile": "diffusion-gemma", "fixed": {"rule": "eb_sampler", "cache": "prefix"},
                               "from_config": {"block_len": ["canvas_length", 256]}}}
NAMES = {"diffusion_gemma": ["DiffusionGemma"]}
