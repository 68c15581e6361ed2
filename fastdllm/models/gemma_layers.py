"""DiffusionGemma's layer (docs/specs/diffusion-gemma.md §3), one module for both modes: the causal
encoder that writes the canvas K/V cache and the bidirectional decoder that reads it differ only in
their attention mask and in their `layer_scalar` (the encoder keeps its own set).

Precision follows transformers' implementation, which is the reference: RMSNorm, RoPE tables, the
router's softmax and the self-conditioning softmax run in fp32 even in an fp64 model (the rest runs
in the model dtype), so that fp64 runs agree with it to rounding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import Span
from .layers import linear
from .moe import SwiGLU, run_experts


class GemmaRMSNorm(nn.Module):
    """x * (mean(x^2) + eps)^-1/2, times a plain weight (not 1 + w), computed in fp32 and cast back."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.type_as(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def inv_frequencies(head_dim: int, theta: float, rotary_fraction: float | None) -> torch.Tensor:
    """fp32 (head_dim/2,): default RoPE over all dims (None), or proportional RoPE: the first
    int(fraction * head_dim / 2) frequencies as for the whole head_dim, the rest 0 (no rotation)."""
    cpu = torch.device("cpu")          # also inside from_pretrained's meta-device construction
    if rotary_fraction is None:
        return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=cpu) / head_dim)
    angles = int(rotary_fraction * head_dim // 2)
    rotated = 1.0 / theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64, device=cpu).float() / head_dim)
    return torch.cat([rotated, torch.zeros(head_dim // 2 - angles, dtype=torch.float, device=cpu)])


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """positions (B, S) -> cos, sin (B, S, 1, D): angles in fp32, then cast to the model dtype."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype)[:, :, None], emb.sin().to(dtype)[:, :, None]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class GemmaAttention(nn.Module):
    """q/k/v projections with per-head q_norm, k_norm and a weightless v_norm, attention scale 1.
    Full-attention layers have no v_proj: their values are the keys before k_norm and RoPE (k_eq_v)."""

    def __init__(self, d: int, n_heads: int, n_kv_heads: int, head_dim: int, eps: float, with_values: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(d, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d, n_kv_heads * head_dim, bias=False) if with_values else None
        self.o_proj = nn.Linear(n_heads * head_dim, d, bias=False)
        self.q_norm = GemmaRMSNorm(head_dim, eps)
        self.k_norm = GemmaRMSNorm(head_dim, eps)
        self.v_norm = GemmaRMSNorm(head_dim, eps, with_scale=False)

    def forward(self, x, span: Span, layer: int) -> torch.Tensor:
        B, S, _ = x.shape
        cos, sin = span.cos, span.sin
        q = rotate(self.q_norm(linear(x, self.q_proj).view(B, S, self.n_heads, self.head_dim)), cos, sin)
        k = linear(x, self.k_proj).view(B, S, self.n_kv_heads, self.head_dim)
        v = linear(x, self.v_proj).view_as(k) if self.v_proj is not None else k
        k, v = rotate(self.k_norm(k), cos, sin), self.v_norm(v)
        keys, values = span.cache.store(layer, span.start, k.transpose(1, 2), v.transpose(1, 2))   # (B, H_kv, T, D)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=span.key_mask, scale=1.0,
                                             enable_gqa=self.n_kv_heads != self.n_heads)
        return linear(out.transpose(1, 2).reshape(B, S, -1), self.o_proj)


class GeGLU(SwiGLU):
    """down(gelu_tanh(gate(x)) * up(x)): SwiGLU's layout with Gemma's activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(gelu_tanh(linear(x, self.gate_proj)) * linear(x, self.up_proj), self.down_proj)


class GemmaRouter(nn.Module):
    """weightless RMSNorm, times `scale` and d^-1/2, `proj`, softmax in fp32, top-k, weights renormalised
    to sum 1, then each times its expert's `per_expert_scale`."""

    def __init__(self, d: int, experts: int, top_k: int, eps: float):
        super().__init__()
        self.top_k = top_k
        self.norm = GemmaRMSNorm(d, eps, with_scale=False)
        self.proj = nn.Linear(d, experts, bias=False)
        self.scale = nn.Parameter(torch.ones(d))
        self.per_expert_scale = nn.Parameter(torch.ones(experts))

    def forward(self, x: torch.Tensor):
        scores = linear(self.norm(x) * self.scale * x.shape[-1] ** -0.5, self.proj)
        weights, experts = scores.softmax(-1, dtype=torch.float32).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return weights * self.per_expert_scale[experts], experts


class PackedExperts(nn.Module):
    """The published layout: all experts in two 3-D tensors, `gate_up_proj` (E, 2I, d) with the gate
    in its first half and `down_proj` (E, d, I). `self[e]` is expert e as a function, for run_experts."""

    def __init__(self, d: int, inner: int, experts: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inner, d))
        self.down_proj = nn.Parameter(torch.empty(experts, d, inner))

    def __len__(self) -> int:
        return self.gate_up_proj.shape[0]

    def __getitem__(self, e: int):
        def expert(x: torch.Tensor) -> torch.Tensor:
            gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
            return F.linear(gelu_tanh(gate) * up, self.down_proj[e])
        return expert


class ExpertLinears(nn.ModuleList):
    """The layout 8/4-bit runs: expert e as a GeGLU of three nn.Linear (`e.gate_proj`, `e.up_proj`,
    `e.down_proj`), which bitsandbytes quantizes; it leaves 3-D tensors at full size. Built empty:
    checkpoints/packed_experts.py fills it from the published tensors, one expert at a time."""


class GemmaLayer(nn.Module):
    """Attention, then the dense GeGLU and the routed experts side by side, each with its norms:
    h = x + post_attn(attn(in(x))); y = post_1(mlp(pre(h))) + post_2(experts(pre_2(h), router(h)));
    out = (h + post_ff(y)) * layer_scalar (the mode's own scalar)."""

    def __init__(self, c, layer: int):
        super().__init__()
        d, eps, full = c.hidden_size, c.rms_norm_eps, c.layer_types[layer] == "full_attention"
        self.full = full
        self.self_attn = GemmaAttention(d, c.num_attention_heads, c.kv_heads(layer), c.head_dim_of(layer), eps,
                                        with_values=not full)
        self.mlp = GeGLU(d, c.intermediate_size)
        self.router = GemmaRouter(d, c.num_experts, c.top_k_experts, eps)
        self.experts = ExpertLinears() if c.experts_apart else \
            PackedExperts(d, c.moe_intermediate_size, c.num_experts)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                     "pre_feedforward_layernorm_2"):
            setattr(self, name, GemmaRMSNorm(d, eps))
        self.register_buffer("layer_scalar", torch.ones(1))

    def fuse(self) -> None:
        """Kept as published: every matmul reads its own weight (inference needs no other layout)."""

    def forward(self, x, span: Span, layer: int, scalar: torch.Tensor) -> torch.Tensor:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), span, layer))
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))
        flat = h.reshape(-1, h.shape[-1])
        weights, chosen = self.router(flat)
        routed = run_experts(self.pre_feedforward_layernorm_2(flat), weights, chosen, self.experts)
        routed = self.post_feedforward_layernorm_2(routed.to(h.dtype).view_as(h))
        return (h + self.post_feedforward_layernorm(dense + routed)) * scalar


class SelfConditioning(GeGLU):
    """The decoder's input: post_norm(embed(canvas) + GeGLU(pre_norm(soft))), where soft = the
    previous step's probabilities (fp32 softmax of its scaled logits) times the scaled embedding;
    zeros at a canvas's first step."""

    def __init__(self, d: int, inner: int, eps: float):
        super().__init__(d, inner)
        self.pre_norm = GemmaRMSNorm(d, eps)
        self.post_norm = GemmaRMSNorm(d, eps, with_scale=False)

    def forward(self, embedded: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        return self.post_norm(embedded + super().forward(self.pre_norm(soft)))
