"""Building blocks shared by the Llama-style diffusion families: RMSNorm, RoPE, attention over the
canvas cache, SwiGLU. Each family keeps its own module names (they are the checkpoint's tensor
names); the arithmetic lives here once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cache import CanvasCache


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # fp64 stays fp64 (exactness tests)


class RMSNorm(nn.Module):
    """Normalise in fp32 (or fp64), cast back, then scale: LLaDA's and Qwen2's order."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(_at_least_fp32(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """positions (B, S) -> cos, sin (B, 1, S, head_dim) in fp32 (fp64 for fp64 models)."""
    dt = _at_least_fp32(dtype)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=dt) / head_dim)
    angles = positions.to(dt)[..., None] * inv_freq            # (B, S, D/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]       # (B, 1, S, D) rotate-half layout
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D); rotation computed at the tables' precision, then cast back."""
    xf = x.to(cos.dtype)
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def self_attention(x: torch.Tensor, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module,
                   o_proj: nn.Module, *, n_heads: int, n_kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, key_mask: torch.Tensor | None,
                   cache: CanvasCache, layer: int, start: int) -> torch.Tensor:
    """Bidirectional attention of the span x (B, S, d) at canvas offset `start` to the whole canvas."""
    B, S, _ = x.shape
    q = q_proj(x).view(B, S, n_heads, head_dim).transpose(1, 2)       # (B, H, S, D)
    k = k_proj(x).view(B, S, n_kv_heads, head_dim).transpose(1, 2)    # (B, H_kv, S, D)
    v = v_proj(x).view(B, S, n_kv_heads, head_dim).transpose(1, 2)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    keys, values = cache.store(layer, start, k, v)                    # (B, H_kv, T, D)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=key_mask,
                                         enable_gqa=n_kv_heads != n_heads)
    return o_proj(out.transpose(1, 2).reshape(B, S, n_heads * head_dim))


def swiglu(x: torch.Tensor, gate: nn.Module, up: nn.Module, down: nn.Module) -> torch.Tensor:
    return down(F.silu(gate(x)) * up(x))
