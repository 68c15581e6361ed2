"""What every diffusion family shares: the span forward the engine calls, the plain full forward
(training, users), cache allocation and weight initialisation. A family supplies its modules under
the checkpoint's names and points `embed`, `blocks`, `final_norm` and `head` at them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from .attention import BIDIRECTIONAL, Attention
from .kv_cache import CanvasCache, Slots, Span
from .layers import RMSNorm, keep_4bit_portable, linear, pack_linear, rotary_tables, take_rows
from .moe import Router


class FamilyConfig(PretrainedConfig):
    """What fastdllm reads off every family's configuration class, with its defaults. The config guard
    (config_guard.py, docs/specs/config-guard.md): `switches`, the keys that change the forward, each
    refused where set beyond fastdllm; `reads`, the keys the family's code reads; `harmless`, the keys
    it may ignore; `nested`, the sub-objects whose keys are checked too ("text_config")."""
    # plain class attributes, not annotated: transformers turns an annotated one into a config.json field
    switches = ()
    reads = frozenset()
    harmless = frozenset()
    nested = ()
    experts_apart = False      # set at loading where the experts are read one tensor each (packed_experts.py)

    def malformed(self) -> list[str]:
        """What is wrong beyond unknown keys (one phrase each; the MoE families check their sizes)."""
        return []


class DiffusionLM(PreTrainedModel):
    base_model_prefix = "model"
    # Logits for canvas position p come from the hidden state at p - logit_shift
    # (0 for LLaDA; 1 for Dream, which predicts the next token like an AR model).
    logit_shift = 0
    # Bidirectional everywhere (LLaDA, Dream); block-causal families return their block size.
    attention: Attention = BIDIRECTIONAL
    # Where config.json has no mask_token_id: the mask token's spellings in the tokenizer, then the
    # id the authors' code passes (MoE families: their config.json and tokenizer name none).
    mask_tokens: tuple[str, ...] = ()
    mask_fallback: int | None = None
    # The expert tensors' published layout, named when a checkpoint stores them otherwise (MoE).
    published_layout: str | None = None
    # Whether a forward can be captured as a CUDA graph (MoE routing sizes its matmuls on the host).
    cuda_graphs = True
    # Whether its block hosts dLLM-Cache's feature-cached layer (cache mode dllm_cache; LLaDA's does).
    feature_cache = False
    # Which decoder runs it: "mask" (the mask loop), "renoise" (decode/renoise.py), "seeded"
    # (decode/seeded.py) or "steerling" (decode/steerling.py).
    sampler = "mask"
    # The dtype of the authors' confidence softmax: "logits" (the logits' own dtype), else fp64 (selection.py).
    authors_softmax = "float64"
    # Their eval scripts put a BOS before a prompt they do not chat-template (Dream; eval/harness.py).
    eval_prompt_bos = False
    # Module-name suffixes kept unquantized under --quantize 8bit/4bit/int8/int4 (a router).
    quantize_skip: tuple[str, ...] = ()
    # Experts published as 3-D tensors: their tensor-name pattern (checkpoints/packed_experts.py), else None.
    packed_experts: str | None = None
    # Positions per routing block under LLaDA2.2's block routing (its experts chosen per block), else None.
    routing_block: int | None = None
    # Why a padded batch is refused (authors who decode one unpadded row at a time), else None.
    padded_batch_refusal: str | None = None
    # Why chat without the checkpoint's chat template is refused, else None.
    plain_chat_refusal: str | None = None
    # Whether the canvas holds mask tokens (False: DiffusionGemma's canvas is noise; its mask id is -1).
    uses_mask = True
    # A family's own mask lookup, mask_of(config dict, tokenizer) -> id (checkpoints/specials.py), else None.
    mask_of: Callable[[dict, Any], int] | None = None
    # A family's own stops, end_tokens(config dict, tokenizer) -> (end of turn, other stop ids), else None.
    end_tokens: Callable[[dict, Any], tuple[int | None, list[int]]] | None = None
    # Set when loading: quantized (no CUDA graphs), the parameter count before quantization, and
    # the 4-bit layers left on bitsandbytes' portable kernel (prepare_for_inference).
    is_quantized = False
    parameters_before_quantization: int | None = None
    portable_4bit_layers = 0
    # RoPE on the first rotary_dim dims of each head (partial rotary; None: all of head_dim).
    rotary_dim: int | None = None
    # The output head's module path (its tensor-name prefix). The family always sets that attribute:
    # the Linear, or None when tied to the input embedding. None here: tied by design (DiffusionGemma).
    head_name: str | None = "lm_head"
    # Set by each family: number of KV heads, head size, RoPE base, end-of-turn discovery aside.
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float

    # --- provided by each family -------------------------------------------------------------
    embed: nn.Embedding
    blocks: nn.ModuleList
    final_norm: RMSNorm

    @property
    def output_head(self) -> nn.Module | None:
        """The module at `head_name`; None when tied to the input embedding."""
        if self.head_name is None:
            return None
        parent, _, name = self.head_name.rpartition(".")
        return getattr(self.get_submodule(parent), name)

    def set_output_head(self, head: nn.Module | None) -> None:
        """Put `head` at `head_name` (a quantized or split head; None: tie it to the embedding)."""
        if self.head_name is None:
            raise ValueError(f"{type(self).__name__}: its head is the embedding, no other can be placed")
        parent, _, name = self.head_name.rpartition(".")
        setattr(self.get_submodule(parent), name, head)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        if self.output_head is None:
            return F.linear(h, self.embed.weight)
        return linear(h, self.output_head)

    def read_files(self, folder: Path) -> None:
        """After loading: files beside the weights the family reads (Nemotron's LoRA adapter, iLLaDA's
        tied head); nothing by default."""

    # --- forwards ------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> MaskedLMOutput:
        """Plain full forward: logits (B, T, V) for every position, unshifted (as the official models)."""
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        cache = self.new_cache(valid, keep_kv=False)
        return MaskedLMOutput(logits=self.head(self.hidden_states(input_ids, 0, cache)))

    def forward_span(self, canvas: torch.Tensor, start: int | Slots, end: int, cache: CanvasCache,
                     logit_positions: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """Recompute canvas span [start, end) against the cache; return logits (B, K, V) for the
        canvas positions `logit_positions` (B, K), which lie in [start, end) (a shifted family:
        up to `end`, predicted from the span's last slot). `widen`: a shifted family recomputes the
        slot before the span too, for a logit at `start`; block-causal decoding never asks for one
        (a block's first token is committed before its steps) and keeps that slot's final K/V.
        `start` may be a position set (Slots, cache mode dkv; `end` is then the canvas length): the
        logit slot (p - logit_shift) of every wanted position is among its fresh slots."""
        if isinstance(start, Slots):
            B, S = start.index.shape
            row_of = torch.zeros_like(canvas).scatter_(1, start.index, torch.arange(S, device=canvas.device).expand(B, S))
            rows = row_of.gather(1, (logit_positions - self.logit_shift).clamp_min(0))    # (B, K) set-relative
            return self.head(self.hidden_states(canvas.gather(1, start.index), start, cache, rows))
        first = max(start - self.logit_shift, 0) if widen else start
        rows = (logit_positions - self.logit_shift - first).clamp_min(0)   # (B, K) span-relative
        return self.head(self.hidden_states(canvas[:, first:end], first, cache, rows))   # (B, K, V)

    def hidden_states(self, ids: torch.Tensor, start: int | Slots, cache: CanvasCache,
                      rows: torch.Tensor | None = None) -> torch.Tensor:
        """ids (B, S) at canvas offset `start` (or at the slots of a position set) -> final hidden
        states (B, S, d), or (B, K, d) at `rows`: the last layer computes outputs only there (its
        keys/values still cover the span)."""
        x = self.embed(ids)                                              # (B, S, d)
        if isinstance(start, Slots):                                     # bidirectional: padding is the only mask
            positions = cache.positions.to(x.device).gather(1, start.index.to(x.device))
            key_mask = cache.mask_for(x.device, 0, cache.length)
        else:
            positions = cache.positions[:, start:start + ids.shape[1]].to(x.device)
            key_mask = cache.mask_for(x.device, start, start + ids.shape[1])
        span = Span(cache, start, *rotary_tables(positions, self.rotary_dim or self.head_dim, self.rope_theta, x.dtype),
                    key_mask)
        last = len(self.blocks) - 1
        for layer, block in enumerate(self.blocks):
            wanted = rows if layer == last else None
            if cache.features is None:
                x = block(x, span, layer, wanted)
            else:     # dLLM-Cache: each layer by its refresh schedule (feature_cache.py; feature_cache families)
                x = take_rows(cache.features.layer(block, x, span, layer), wanted)
        return self.final_norm(x)

    def prepare_for_inference(self, pack: bool = True) -> None:
        """After placement: one matmul for q/k/v and one for gate/up in every block, and on CPU
        (with `pack`) the weights in oneDNN's blocked layout where this CPU has kernels for their
        dtype; 4-bit layers of shapes bitsandbytes' bf16 CPU kernel cannot take on its portable
        kernel (layers.keep_4bit_portable). Numerics are unchanged; the module is then for inference only (fused parameters
        change shape)."""
        from .cpu import packable_dtypes

        for block in self.blocks:
            block.fuse()
        dtypes = packable_dtypes() if pack else frozenset()     # asked once, not layer by layer
        self.portable_4bit_layers = 0        # 4-bit layers bitsandbytes' bf16 CPU kernel cannot take
        for module in list(self.blocks.modules()) + [self.output_head]:
            if isinstance(module, nn.Linear):
                pack_linear(module, dtypes)
                self.portable_4bit_layers += keep_4bit_portable(module)

    @classmethod
    def check_loaded(cls, report: dict) -> None:
        """After from_pretrained: refuse a checkpoint whose tensors do not match the modules (missing
        ones would silently stay random). ValueError, one line."""
        missing, unexpected = report.get("missing_keys") or [], report.get("unexpected_keys") or []
        if cls.published_layout and any(".experts." in n or ".mlp.w" in n for n in [*missing, *unexpected]):
            raise ValueError(f"experts not in the published layout ({cls.published_layout}): "
                             f"{', '.join(sorted(unexpected or missing)[:3])}")
        for what, names in (("missing", missing), ("unexpected", unexpected if cls.published_layout else [])):
            if names:
                raise ValueError(f"{what} tensors {', '.join(sorted(names)[:3])}" + (" ..." if len(names) > 3 else ""))

    # --- cache ---------------------------------------------------------------------------------
    def new_cache(self, valid: torch.Tensor, keep_kv: bool = True, block: int | None = None) -> CanvasCache:
        dtype = self.embed.weight.dtype  # the compute dtype, also under 8/4-bit quantization
        layers = [(_execution_device(block), dtype) for block in self.blocks]
        return CanvasCache.allocate(valid, layers=layers, kv_heads=self.n_kv_heads,
                                    head_dim=self.head_dim, keep_kv=keep_kv, block=block)

    @property
    def input_device(self) -> torch.device:
        return _execution_device(self.embed)

    # --- transformers plumbing ---------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def _init_weights(self, module: nn.Module) -> None:
        std = getattr(self.config, "initializer_range", None) or getattr(self.config, "init_std", 0.02)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:     # an Embedding has none
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, Router):
            nn.init.normal_(module.weight, mean=0.0, std=std)


def _execution_device(module: nn.Module) -> torch.device:
    """Where `module` computes: accelerate's hook says so for offloaded modules (weights on meta)."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return next(module.parameters()).device


class DecoderStack(DiffusionLM):
    """The layout the Qwen-style and Ling-style checkpoints share: `model.<embed_name>`,
    `model.layers`, `model.norm`, and an `lm_head` unless tied to the embedding."""
    embed_name = "embed_tokens"

    def build_stack(self, config, layers) -> None:
        self.model = nn.Module()
        setattr(self.model, self.embed_name, nn.Embedding(config.vocab_size, config.hidden_size))
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else \
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.rope_theta = config.rope_theta

    @property
    def embed(self):
        return getattr(self.model, self.embed_name)

    @property
    def blocks(self):
        return self.model.layers

    @property
    def final_norm(self):
        return self.model.norm
