"""int4 for CPUs (docs/specs/cpu-quantization.md, 2): symmetric groups of GROUP along K with two-level
scales, so that one packed weight serves two kernels.

Format: w = c * step, c in [-8, 7] (stored as q = c + 8 in [0, 15]), step[n, g] = m[n, g] * 2^e[n]
with m an integer in [-15, 15] per group and 2^e a power of two per output row. As in llama.cpp's
q4_0, a group's largest-magnitude weight maps to code -8 (the sign goes into m). Because m has 4
bits and 2^e none, every step is exact in bf16, and c * m is an int8 code in [-120, 120]:

- under `w4a8_rows()` rows (48; below, the unpacking is not paid back), torch's weight-only
  int4 kernel, `_weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_and_zeros)` with the steps as scales and
  zeros 0 (the kernel's w = (q - 8) * scale + zero);
- from there on (W4A8), the packed codes are unpacked to int8 c * m (K, N) and multiplied by the
  activations quantized per row, `torch._int_mm`, then rescaled by s_x and 2^e in fp32: the
  weight-only kernel is a matrix-vector kernel, 1.2-3x slower than this from 48 rows on.

Both paths multiply by the very same weight, `dequantized()`."""

from __future__ import annotations

import torch
from torch import nn

from .cpu_kernels import (
    QuantLinear,
    int4pack_codes,
    int4pack_panel,
    int8_matmul,
    w4a8_rows,
)

GROUP = 32             # along K; docs/specs/cpu-quantization.md, 2: accuracy against group 64


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (q (N, K) int32 in [0, 15], m (N, K/GROUP) int8, row (N,) fp32 powers of
    two): w ~ (q - 8) * m * row. The ideal step of a group (its largest-magnitude weight over -8)
    lies between two multiples of `row`; of the two, the one with the smaller squared error over
    the group is kept (each code the nearest under it)."""
    N, K = w.shape
    g = w.detach().float().view(N, K // GROUP, GROUP)
    extreme = g.gather(-1, g.abs().argmax(-1, keepdim=True)).squeeze(-1)    # (N, K/G), signed
    ideal = extreme / -8                                                     # extreme -> code -8
    top = ideal.abs().amax(1)                                                # (N,)
    row = torch.exp2(torch.ceil(torch.log2(top.clamp_min(2.0 ** -110) / 15)))
    row = torch.where(row * 15 < top, row * 2, row)[:, None]                 # log2's rounding
    ratio = ideal / row                                                      # |ratio| <= 15
    sign = torch.where(ratio < 0, -1.0, 1.0)
    m_lo, m_hi = (torch.where(ideal == 0, 0.0, sign * mag)                   # an all-zero group: 0
                  for mag in (ratio.abs().floor().clamp(1, 15), ratio.abs().ceil().clamp(1, 15)))
    (c_lo, e_lo), (c_hi, e_hi) = _codes(g, m_lo, row), _codes(g, m_hi, row)
    pick_hi = e_hi < e_lo                                                    # (N, K/G)
    c = torch.where(pick_hi[..., None], c_hi, c_lo)
    m = torch.where(pick_hi, m_hi, m_lo)
    return (c + 8).to(torch.int32).view(N, K), m.to(torch.int8), row.squeeze(1)


def _codes(g: torch.Tensor, m: torch.Tensor, row: torch.Tensor):
    """Groups g (N, K/G, G) under steps m * row (m (N, K/G), an all-zero group's 0; row (N, 1)):
    (codes c in [-8, 7], squared error per group)."""
    step = (m * row)[..., None]                                              # (N, K/G, 1)
    c = (g / torch.where(step != 0, step, 1)).round().clamp(-8, 7)
    return c, (c * step - g).square().sum(-1)


def dequantize_int4(q: torch.Tensor, m: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """The float weight (N, K) fp32 that codes q (N, K), multipliers m (N, K/GROUP) and row scales
    (N,) stand for (exact: products of small integers and a power of two)."""
    N, K = q.shape
    step = m.float() * row[:, None]                                          # (N, K/G)
    return ((q.view(N, K // GROUP, GROUP).float() - 8) * step[..., None]).view(N, K)


def int4_buffers(q: torch.Tensor, m: torch.Tensor, row: torch.Tensor, dtype: torch.dtype) -> dict:
    """quantize_int4's (q, m, row) -> the Int4Linear's buffers: the packed codes, the steps as the
    weight-only kernel's scales (zeros 0), the multipliers and row scales of W4A8."""
    step = (m.float() * row[:, None]).T                                      # (K/G, N), exact in dtype
    return {"weight": torch._convert_weight_to_int4pack_for_cpu(q, 1),         # (N, K/2) uint8
            "scales_and_zeros": torch.stack([step, torch.zeros_like(step)], -1).to(dtype),
            "multipliers": m.T.contiguous(),                                   # (K/G, N) int8
            "row_scales": row}                                                 # (N,) fp32


class Int4Linear(QuantLinear):
    """int4 weights (the module docstring): weight-only under `w8a8_rows` rows (`w4a8_rows()`),
    W4A8 from there, where `_int_mm` is exact and `int4pack_codes` reads this torch's packing."""
    fmt = "int4"

    def __init__(self, lin: nn.Linear, dtype: torch.dtype, buffers: dict | None = None):
        """`buffers`: int4_buffers made beforehand (a GGUF file's tensors, checkpoints/gguf_int4.py);
        else quantized from `lin.weight`."""
        super().__init__(lin, dtype)
        for name, tensor in (buffers or int4_buffers(*quantize_int4(lin.weight), dtype)).items():
            self.register_buffer(name, tensor)
        self.panel = int4pack_panel()                                        # the packing's, for W4A8
        self.w8a8_rows = w4a8_rows()                                         # int8 activations from here

    def matmul_weight_only(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.weight, GROUP, self.scales_and_zeros)

    def int8_codes(self) -> torch.Tensor:
        """(K, N) int8: c * m, unpacked from the packed weight (a new tensor each call)."""
        K, N = self.in_features, self.out_features
        codes = int4pack_codes(self.weight, N, K, self.panel).view(torch.int8).view(K // GROUP, GROUP, N)
        return codes.sub_(8).mul_(self.multipliers[:, None]).view(K, N)

    def matmul_int8(self, x: torch.Tensor) -> torch.Tensor:
        """W4A8."""
        return int8_matmul(x, self.int8_codes(), self.row_scales)

    def dequantized(self) -> torch.Tensor:
        """Read back through the weight-only kernel: identity rows (fp32, one product each: exact)."""
        eye = torch.eye(self.in_features, dtype=torch.float32)
        return torch._weight_int4pack_mm_for_cpu(eye, self.weight, GROUP,
                                                 self.scales_and_zeros.float()).T.contiguous()
