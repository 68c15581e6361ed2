"""Building blocks shared by the Llama-style diffusion families: RMSNorm, RoPE, attention over the
canvas cache, SwiGLU. Each family keeps its own module names (they are the checkpoint's tensor
names); the arithmetic lives here once."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import Span


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # fp64 stays fp64 (exactness tests)


class RMSNorm(nn.Module):
    """Normalise in fp32 (or fp64), cast back, then scale: LLaDA's and Qwen2's order."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.to(at_least_fp32(x.dtype)), (x.shape[-1],), eps=self.eps)   # x * rsqrt(mean(x^2) + eps)
        return self.weight * h.to(x.dtype)


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """positions (B, S) -> cos, sin (B, S, 1, head_dim) in fp32 (fp64 for fp64 models)."""
    dt = at_least_fp32(dtype)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=dt) / head_dim)
    angles = positions.to(dt)[..., None] * inv_freq            # (B, S, D/2)
    angles = torch.cat([angles, angles], dim=-1)[:, :, None]    # (B, S, 1, D) rotate-half layout
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, H, D); rotation computed at the tables' precision, then cast back. Tables narrower
    than D (partial rotary, LLaDA2: R = D/2) rotate the first R dims and pass the rest through."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat([apply_rotary(x[..., :rotary], cos, sin), x[..., rotary:]], dim=-1)
    xf = x.to(cos.dtype)
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def fuse_linears(*linears: nn.Module) -> bool:
    """Inference layout for linears that read the same input (q/k/v; gate/up): the first Linear
    holds the group's weights as one matrix (and the others empty tensors), so `project` does one
    matmul instead of several, with no extra memory. Plain nn.Linear only (quantized or offloaded
    layers keep separate matmuls). Parameter counts are unchanged; shapes are not: inference only."""
    weights = [lin.weight for lin in linears]
    has_bias = {lin.bias is not None for lin in linears}
    if any(type(lin) is not nn.Linear for lin in linears) or any(w.is_meta for w in weights) \
            or len({(w.device, w.dtype) for w in weights}) > 1 or len(has_bias) > 1:
        return False
    with torch.no_grad():
        weight = torch.cat([w.detach() for w in weights])
        bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias == {True} else None
    sizes = [w.shape[0] for w in weights]
    first = linears[0]
    first.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        first.bias = nn.Parameter(bias, requires_grad=False)
    for lin in linears[1:]:
        lin.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias.new_empty(0), requires_grad=False)
    first.fused_sizes = sizes
    return True


def pack_linear(lin: nn.Module, dtypes: frozenset[torch.dtype]) -> bool:
    """On CPU, keep a Linear's weight in oneDNN's blocked layout: bit-identical results, 20-30%
    faster matmuls with few rows (no re-layout of the weight at every call), no extra memory.
    `dtypes`: the weight dtypes this CPU can pack, decided once per load (`cpu.packable_dtypes`)."""
    w = lin.weight
    if type(lin) is not nn.Linear or w.device.type != "cpu" or w.dtype not in dtypes or w.numel() == 0:
        return False
    lin.weight = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(w.detach()), requires_grad=False)
    return True


def cpu_4bit_packable(out_features: int, in_features: int, blocksize: int = 64) -> bool:
    """Whether bitsandbytes' AVX-512-bf16 CPU kernel can take a 4-bit weight of this shape: it
    repacks the weight in panels of 32 output rows and its absmax per whole input block."""
    return out_features % 32 == 0 and in_features % blocksize == 0 and in_features % 2 == 0


def keep_4bit_portable(lin: nn.Module) -> bool:
    """A bitsandbytes 4-bit Linear (0.49+) repacks its weight for its AVX-512-bf16 CPU kernel at its
    first CPU forward, where the CPU has bf16 units, and fails on shapes that kernel cannot take.
    Such a layer keeps bitsandbytes' portable 4-bit kernel, the one every other CPU runs: the same
    4-bit weights, the same answer as there. Every linear of the published checkpoints packs (all
    their sizes are multiples of 64); tiny test models have some that do not. True if it changed."""
    if not getattr(lin, "support_avx512bf16_for_cpu", False):
        return False
    if cpu_4bit_packable(lin.out_features, lin.in_features, getattr(lin.weight, "blocksize", 64)):
        return False
    lin.support_avx512bf16_for_cpu = False
    return True


def linear(x: torch.Tensor, lin: nn.Module) -> torch.Tensor:
    if lin.weight is not None and lin.weight.is_mkldnn:   # packed: pack_linear; None: a wrapper (LoRA) calls forward
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), lin.weight, lin.bias, "none", [], "")
    return lin(x)


def project(x: torch.Tensor, *linears: nn.Module) -> tuple[torch.Tensor, ...]:
    """Apply linears that share an input: one matmul when they were fused."""
    sizes = getattr(linears[0], "fused_sizes", None)
    if sizes is not None:
        return linear(x, linears[0]).split(sizes, dim=-1)
    return tuple(linear(x, lin) for lin in linears)


def project_values(x: torch.Tensor, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module) -> torch.Tensor:
    """The V projection alone; under fused q/k/v its rows of the fused matrix (all three where the
    weight is in oneDNN's packed layout, which cannot be sliced)."""
    sizes = getattr(q_proj, "fused_sizes", None)
    if sizes is None:
        return linear(x, v_proj)
    w, b, lo = q_proj.weight, q_proj.bias, sizes[0] + sizes[1]
    if w.is_mkldnn:
        return project(x, q_proj, k_proj, v_proj)[2]
    return F.linear(x, w[lo:], None if b is None else b[lo:])


def self_attention(x: torch.Tensor, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module,
                   o_proj: nn.Module, *, n_heads: int, n_kv_heads: int, head_dim: int, span: Span, layer: int,
                   rows: torch.Tensor | None = None, q_norm: nn.Module | None = None,
                   k_norm: nn.Module | None = None, qkv_sizes: list[int] | None = None) -> torch.Tensor:
    """Attention of the span x (B, S, d) at `span.start` to the whole canvas, under `span.key_mask`
    (B, 1, 1 or S, T): padding, and for block-causal families the block structure.
    Every span position's keys/values are stored; outputs are computed for `rows` (B, K) only
    when given (the last layer: only positions whose logits are wanted need an output).
    q_norm / k_norm: Qwen3's per-head RMSNorm, applied before RoPE. `qkv_sizes`: the checkpoint
    stores q/k/v as one matrix (LLaDA2's query_key_value, passed as q_proj) of these row counts.
    `span.q_scale` (B, S): a factor per query after RoPE (Nemotron-Labs Diffusion's Llama-4 scaling)."""
    B, S, _ = x.shape
    cache, key_mask = span.cache, span.key_mask
    q, k, v = linear(x, q_proj).split(qkv_sizes, -1) if qkv_sizes else project(x, q_proj, k_proj, v_proj)
    qk = torch.cat([q, k], -1).view(B, S, n_heads + n_kv_heads, head_dim)
    if q_norm is not None:
        qk = torch.cat([q_norm(qk[:, :, :n_heads]), k_norm(qk[:, :, n_heads:])], 2)
    qk = apply_rotary(qk, span.cos, span.sin)                          # one rotation for q and k
    q, k = qk[:, :, :n_heads].transpose(1, 2), qk[:, :, n_heads:].transpose(1, 2)   # (B, H, S, D), (B, H_kv, S, D)
    if span.q_scale is not None:
        q = q * span.q_scale[:, None, :, None].to(q.dtype)
    if cache.tap is not None:                                          # FOCUS reads layers 0 and 1's q/k
        cache.tap(layer, q, k)
    v = v.reshape(B, S, n_kv_heads, head_dim).transpose(1, 2)
    keys, values = cache.store(layer, span.start, k, v)               # (B, H_kv, T, D)
    if rows is not None:
        q = q.gather(2, rows[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1]))
        if key_mask is not None and key_mask.shape[2] > 1:             # a mask per query: keep the rows'
            key_mask = key_mask.gather(2, rows[:, None, :, None].expand(-1, 1, -1, key_mask.shape[-1]))
        S = rows.shape[1]
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=key_mask, enable_gqa=n_kv_heads != n_heads)
    return linear(out.transpose(1, 2).reshape(B, S, n_heads * head_dim), o_proj)


def loose_span_args(forward):
    """Transitional, for callers not switched to `Span` yet (decode/focus.py): a block forward
    called as (x, cos, sin, key_mask, cache, layer, start, rows...) gets (x, Span, layer, rows...)."""
    @functools.wraps(forward)
    def wrapper(self, x, *args, **kwargs):
        if args and not isinstance(args[0], Span):
            cos, sin, key_mask, cache, layer, start, *rest = args
            return forward(self, x, Span(cache, start, cos, sin, key_mask), layer, *rest, **kwargs)
        return forward(self, x, *args, **kwargs)
    return wrapper


def take_rows(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """x (B, S, d), rows (B, K) -> (B, K, d); all of x when rows is None."""
    return x if rows is None else x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))


def swiglu(x: torch.Tensor, gate: nn.Module, up: nn.Module, down: nn.Module) -> torch.Tensor:
    g, u = project(x, gate, up)
    return linear(F.silu(g) * u, down)
