"""What the CPU int8 and int4 linears share (docs/specs/cpu-quantization.md): the module frame around a
kernel, the activations' per-row int8 quantization, the probe that says whether `torch._int_mm`
sums exactly here, and the unpacking of torch's CPU int4 layout into codes `_int_mm` can take.

W8A8 (int8) and W4A8 (int4) both run `torch._int_mm(q_x (M, K) int8, q_w (K, N) int8) -> int32`
from `w8a8_rows()` rows on; under it, and where `int8_products()` says no, the weight-only kernels."""

from __future__ import annotations

import torch
from torch import nn

# From this many rows (M of the flattened (M, K) input) the quantized linears quantize their
# activations too and run int8 x int8 (`torch._int_mm`); below, the weight-only kernels
# (docs/specs/cpu-quantization.md, 1b and 1c): int8 (W8A8) from 16 rows, int4 (W4A8, which unpacks its
# codes to int8 at every call first) from 48. None: weight-only at every M. Only where `_int_mm`
# is exact (and, for int4, where `int4pack_codes` reads the packing).
W8A8_ROWS: int | None = 16
W4A8_ROWS: int | None = 48
# The output head (vocab x d: a huge N, so quantizing the few rows of activations costs nothing
# beside it) runs W8A8 at every row count: 1.1-1.9x bf16 from 1 to 32 rows at vocab 152k (1d).
HEAD_W8A8_ROWS = 1


def w8a8_rows(head: bool = False) -> int | None:
    """None where W8A8 is off (W8A8_ROWS None, or no int8 products here: int8_products)."""
    if W8A8_ROWS is None or not int8_products():
        return None
    return HEAD_W8A8_ROWS if head else W8A8_ROWS


def w4a8_rows() -> int | None:
    return W4A8_ROWS if W4A8_ROWS is not None and int8_products() and int4pack_panel() else None


class QuantLinear(nn.Module):
    """What both formats share: (in, out) sizes, the bias, the 2-D reshape around the kernel, the
    switch by row count between `matmul_weight_only` and `matmul_int8` (from `w8a8_rows` rows,
    None: never; set at build). The packed weight is a buffer named `weight` (layers.linear reads
    `weight.is_mkldnn`)."""
    w8a8_rows: int | None = None

    def __init__(self, lin: nn.Linear, dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = lin.weight.shape            # a fused linear's rows: the group's
        self.dtype = dtype
        bias = None if lin.bias is None else lin.bias.detach().to(dtype)
        self.register_buffer("bias", bias)
        if hasattr(lin, "fused_sizes"):                                  # q/k/v or gate/up in one matrix
            self.fused_sizes = lin.fused_sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self.matmul(x.reshape(-1, self.in_features).to(self.dtype).contiguous())   # (M, N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.w8a8_rows is not None and x.shape[0] >= self.w8a8_rows:
            return self.matmul_int8(x)
        return self.matmul_weight_only(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations x (M, K) -> (q (M, K) int8, scale (M,) fp32): symmetric per row, dynamic,
    s = max|x_row| / 127, q = round(x / s) (half to even) clamped to [-127, 127], all in fp32."""
    x = x.to(torch.float32, copy=True)                                 # modified in place below
    scale = x.abs().amax(1).div_(127).clamp_min_(1e-30)                # an all-zero row: codes 0
    q = x.div_(scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_matmul(x: torch.Tensor, codes: torch.Tensor, col_scale: torch.Tensor) -> torch.Tensor:
    """x (M, K) float, codes (K, N) int8 (a transposed view is fine), col_scale (N,): the int8 x
    int8 product of quantize_rows(x) and the codes, summed exactly in int32, rescaled in fp32 by
    s_x (per row) and col_scale (per column), rounded to x's dtype once."""
    q, scale = quantize_rows(x)
    acc = torch._int_mm(q, codes)                                        # (M, N) int32
    return acc.float().mul_(scale[:, None]).mul_(col_scale.float()).to(x.dtype)


_INT_MM_EXACT: bool | None = None


def int8_products() -> bool:
    """Whether W8A8 / W4A8 run here: `_int_mm` exact and the CPU has VNNI units. Without VNNI oneDNN's
    s8 x s8 either saturates (int_mm_exact False) or, on some AVX2-only CPUs, sums exactly but through
    a slow path: an AMD EPYC (AVX2, no VNNI) took 218 ms for a (96, 64) x (64, 1536) product against
    0.94 ms for the weight-only kernel, and `_int_mm` was 81% of an int8 forward there
    (docs/reports/vs-llamacpp.md, GGUF section)."""
    return int_mm_exact() and torch.cpu._is_vnni_supported()


def int_mm_exact() -> bool:
    """Whether `torch._int_mm` (s8 x s8 -> s32, oneDNN) sums exactly on this machine; checked once.
    With VNNI (AVX-512 VNNI, AVX-VNNI) it does. Without (AVX2, AVX-512 before VNNI, or oneDNN held
    to AVX2 by ONEDNN_MAX_CPU_ISA=AVX2) oneDNN's int8 kernels add u8 x s8 pairs in saturating int16
    (vpmaddubsw) and are wrong by up to the whole value (docs/specs/cpu-quantization.md): the probe, rows
    of +127, -127 and random codes, saturates there; where it does, the linears stay weight-only."""
    global _INT_MM_EXACT
    if _INT_MM_EXACT is None:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (16, 512), generator=g, dtype=torch.int8)
        a[0], a[1] = 127, -127
        b = torch.randint(-127, 128, (48, 512), generator=g, dtype=torch.int8)
        b[0] = 127
        try:
            _INT_MM_EXACT = torch.equal(torch._int_mm(a, b.t()).long(), a.long() @ b.long().t())
        except RuntimeError:
            _INT_MM_EXACT = False
    return _INT_MM_EXACT


def int4pack_codes(packed: torch.Tensor, N: int, K: int, panel: int) -> torch.Tensor:
    """`_convert_weight_to_int4pack_for_cpu(q (N, K), 1)` (N, K/2) uint8 -> q.T (K, N) uint8, codes
    in [0, 15], as a new tensor. The layout (torch 2.13, read off the packing, checked at run time
    by `int4pack_panel`): rows in panels of `panel` (64 on AVX-512, 32 on AVX2: the kernel's
    block), each K x panel/2 bytes, byte [k, j] holding row j in its low nibble and row panel/2 + j
    in its high one; a tail panel of r rows (r even) is K x r/2 bytes, byte [k, j] holding rows 2j
    (low) and 2j + 1 (high)."""
    full = N // panel * panel
    parts = []
    if full:      # the nibbles first, on the contiguous bytes (5x faster than on the transposed view)
        p = packed[:full].view(N // panel, K, panel // 2)                              # (panels, K, P/2)
        lo, hi = (p & 15).transpose(0, 1), (p >> 4).transpose(0, 1)                    # (K, panels, P/2)
        parts.append(torch.stack([lo, hi], 2).view(K, full))                          # (K, panels, 2, P/2)
    if N > full:
        p = packed[full:].view(K, (N - full) // 2)
        parts.append(torch.stack([p & 15, p >> 4], -1).view(K, N - full))             # (K, r/2, 2)
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


_INT4_PANEL: int | None | bool = False          # False: not probed yet


def int4pack_panel() -> int | None:
    """The panel size with which `int4pack_codes` reads this machine's packing right (whole panels
    and a tail), probed once; None where neither size does (another torch): int4 then stays on the
    weight-only kernel at every row count."""
    global _INT4_PANEL
    if _INT4_PANEL is False:
        g = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (64 + 16, 64), generator=g, dtype=torch.int32)
        try:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        except (RuntimeError, AttributeError):
            packed = None
        _INT4_PANEL = next((panel for panel in (64, 32) if packed is not None
                            and torch.equal(int4pack_codes(packed, *q.shape, panel).T.int(), q)), None)
    return _INT4_PANEL
