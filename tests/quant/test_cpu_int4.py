"""int4's format (models/cpu_int4.py) and the unpacking of torch's int4 packing (cpu_kernels.py):
the codes, multipliers and row scales against their definition, one weight behind both kernels,
torch's packing read back at panel and tail sizes. The module against float matmuls, W4A8 against
its definition and whole models: tests/quant/test_cpu_quant.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fastdllm.models.cpu_int4 import GROUP, Int4Linear, dequantize_int4, quantize_int4
from fastdllm.models.cpu_kernels import int4pack_codes, int4pack_panel


@pytest.mark.parametrize("N", [16, 48, 64, 80, 192, 208])     # whole panels of 64, tails, both
@pytest.mark.parametrize("K", [32, 96])
def test_int4pack_codes_reads_torchs_packing(N, K):
    if int4pack_panel() is None:
        pytest.skip("torch's generic (DEFAULT) kernels pack otherwise: int4 stays weight-only there")
    q = torch.randint(0, 16, (N, K), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    codes = int4pack_codes(packed, N, K, int4pack_panel())
    assert codes.shape == (K, N) and codes.dtype == torch.uint8 and torch.equal(codes.T.int(), q)


def test_the_layout_probe_knows_this_torch():
    """torch 2.13 (the version the project installs) packs as int4pack_codes reads, in panels of 64
    where its kernels are AVX-512 ones, 32 under AVX2 (ATEN_CPU_CAPABILITY=avx2: CI's second pass);
    its generic kernels (ATEN_CPU_CAPABILITY=default) pack otherwise, and the probe says so."""
    expected = {"AVX512": 64, "AVX2": 32}.get(torch.backends.cpu.get_cpu_capability())
    assert int4pack_panel() == expected


def weights() -> torch.Tensor:
    """(96, 256): Gaussian rows, a heavy-tailed row, an all-zero group, a group 1000x smaller than
    its row's largest, a row of zeros, a constant group and a lone outlier."""
    torch.manual_seed(0)
    w = torch.randn(96, 256) * 0.02
    w[1] = torch.distributions.StudentT(3.0).sample((256,)) * 0.02
    w[2, :GROUP] = 0
    w[3, GROUP:2 * GROUP] *= 1e-3
    w[4] = 0
    w[5, :GROUP] = 0.01
    w[6, 7] = 0.5
    return w


def test_codes_multipliers_and_row_scales_are_what_the_format_says():
    w = weights()
    q, m, row = quantize_int4(w)
    N, K = w.shape
    assert q.shape == (N, K) and m.shape == (N, K // GROUP) and row.shape == (N,)
    assert q.min() >= 0 and q.max() <= 15 and m.abs().max() <= 15
    mantissa, _ = torch.frexp(row)
    assert (mantissa == 0.5).all()                                       # powers of two
    step = m.float() * row[:, None]
    assert torch.equal(step.bfloat16().float(), step)                    # exact in bf16
    groups, codes = w.view(N, -1, GROUP), q.view(N, -1, GROUP).float() - 8
    assert torch.equal(codes[2, 0], torch.zeros(GROUP)) and (m[2, 0] == 0) and (m[4] == 0).all()
    assert m[3, 1] != 0                                                  # a tiny group keeps a step
    # each code is the nearest under its group's step, or the clamped end
    err = (codes * step[..., None] - groups).abs()
    inside = (codes > -8) & (codes < 7)
    assert (err[inside] <= step.abs()[..., None].expand_as(err)[inside] / 2 * (1 + 1e-6)).all()
    # the step is the better of the two multiples of the row scale around the ideal one
    ideal = groups.gather(-1, groups.abs().argmax(-1, keepdim=True)).squeeze(-1) / -8
    ratio = ideal / row[:, None]
    live = ideal != 0
    assert ((m.float() - ratio).abs()[live] < 1).all()
    for other in (torch.floor(ratio), torch.ceil(ratio)):
        other = torch.where(other == 0, torch.sign(ratio), other).clamp(-15, 15)
        s = (other * row[:, None])[..., None]
        c = (groups / torch.where(s != 0, s, 1)).round().clamp(-8, 7)
        sse_other = (c * s - groups).square().sum(-1)
        sse = (codes * step[..., None] - groups).square().sum(-1)
        assert (sse[live] <= sse_other[live] * (1 + 1e-6) + 1e-30).all()


def test_accuracy_on_random_weights_is_what_the_doc_says():
    """Relative RMS weight error, std-0.02 Gaussian (docs/specs/cpu-quantization.md, 2): 8.6%, as q4_0's
    (symmetric groups of 32, an fp16 step each) on the same weights."""
    torch.manual_seed(0)
    w = torch.randn(1024, 896) * 0.02
    rel = ((dequantize_int4(*quantize_int4(w)) - w).norm() / w.norm()).item()
    assert 0.083 < rel < 0.089, rel


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N", [96, 80])
def test_both_kernels_read_one_weight(dtype, N):
    """The weight-only kernel's weight (read back through it) and W4A8's int8 codes times the row
    scales are the format's dequantized weight, exactly."""
    torch.manual_seed(0)
    lin = nn.Linear(256, N, bias=False)
    with torch.no_grad():
        lin.weight.copy_(weights()[:N])
    q = Int4Linear(lin, dtype)
    expected = dequantize_int4(*quantize_int4(lin.weight))
    assert torch.equal(q.dequantized(), expected)
    if q.panel is None:                                                  # generic kernels: no W4A8
        assert q.w8a8_rows is None
        return
    codes = q.int8_codes()
    assert codes.shape == (256, N) and codes.dtype == torch.int8 and codes.abs().max() <= 120
    assert torch.equal(codes.T.float() * q.row_scales[:, None], expected)


def test_bytes_per_weight_are_what_info_estimates():
    """checkpoints/info.py counts int4 block weights at 0.5 + 5/32 bytes: codes, the kernel's bf16
    step and zero per 32, W4A8's int8 multiplier per 32; the fp32 row scales come on top."""
    q = Int4Linear(nn.Linear(896, 1152, bias=False), torch.bfloat16)
    held = sum(b.numel() * b.element_size() for b in q.buffers())
    assert held == 1152 * 896 * (0.5 + 5 / 32) + 1152 * 4
