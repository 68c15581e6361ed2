"""--quantize int8 / int4 (models/cpu_quant.py, cpu_int4.py): the kernels against float matmuls of the
weights they stand for, W8A8/W4A8 against their definition, the packed weights read back. Whole
models, the CLI, bad input: tests/quant/test_cpu_quant_models.py.

Tolerances. Both kernels accumulate in fp32. With fp32 activations their output is an fp32 sum in
another order than the reference's: |diff| <= 1e-5 * sum|x||w| (measured: ~1e-7 of it). With bf16
activations the kernel's output is rounded to bf16 (half an ulp: at most 2^-8 of |value|, bf16
keeping 7 mantissa bits), and once more after adding a bias: we allow 2^-8 (|x w| + |ref|) plus the
fp32 order term (measured without bias: at most half an ulp, test_measured_error_of_the_bf16_kernels).

Int8Linear from W8A8_ROWS rows on (W8A8: activations quantized per row too, `torch._int_mm`): its
definition is fake_quant(x) @ dequant(w).T + b, computed here in float64. The int8 x int8 sum is
exact in int32 (|sum| <= K 127^2 < 2^31 for K < 133000); what remains is fp32 rounding: the int32
sum to fp32 (exact below 2^24, else 2^-24 relative), times s_x, times s_w (2^-24 each), + bias
(2^-24 of |out|): we allow 2^-22 (|x w| + |out|), plus bf16's half ulp at bf16 (measured: see
test_w8a8_equals_its_definition). The weight-only tests run with W8A8 off (`weight_only`)."""

from __future__ import annotations

import pytest
import torch
from helpers import fake_quant
from torch import nn

from fastdllm.models import cpu_kernels
from fastdllm.models.cpu_int4 import Int4Linear
from fastdllm.models.cpu_kernels import QuantLinear, int8_products, int_mm_exact, quantize_rows
from fastdllm.models.cpu_quant import (
    Int8Embedding,
    Int8Linear,
    quantize_int8,
)

HALF_ULP = 2.0 ** -8           # bf16's half ulp relative to a value, at most (7 stored mantissa bits)
FP32_W8A8 = 2.0 ** -22         # the W8A8 path's fp32 roundings (int32 -> fp32, two scale products, bias)
needs_int8_products = pytest.mark.skipif(not int8_products(), reason="no VNNI here (torch._int_mm saturates or is slow): W8A8 off")


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


@pytest.fixture
def weight_only(monkeypatch):
    """Int8Linear and Int4Linear built in the test run the weight-only kernels at every row count."""
    monkeypatch.setattr(cpu_kernels, "W8A8_ROWS", None)
    monkeypatch.setattr(cpu_kernels, "W4A8_ROWS", None)


def close_to_kernel(y: torch.Tensor, ref: tuple, dtype) -> bool:
    """y: the module's output; ref: `reference`'s (fp32 x w + b, fp32 x w, |x| |w|)."""
    out, product, bound = ref
    tol = 1e-5 * bound + (HALF_ULP * (product.abs() + out.abs()) if dtype == torch.bfloat16 else 0)
    return bool(((y.float() - out).abs() <= tol).all())


def reference(x: torch.Tensor, w: torch.Tensor, bias=None):
    product = x.float() @ w.T
    return product + (0 if bias is None else bias.float()), product, x.float().abs() @ w.abs().T


@pytest.fixture
def linear():
    torch.manual_seed(0)
    lin = nn.Linear(256, 96, bias=True)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        lin.bias.normal_(0, 0.1)
    return lin


@pytest.mark.usefixtures("weight_only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("make", [Int8Linear, Int4Linear], ids=["int8", "int4"])
def test_module_equals_a_float_matmul_of_its_dequantized_weight(linear, make, dtype):
    q = make(linear, dtype)
    x = torch.randn(2, 5, 256).to(dtype)                       # 3-D in, reshaped to (10, 256) inside
    y = q(x)
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    assert close_to_kernel(y.reshape(-1, 96), reference(x.reshape(-1, 256), q.dequantized(), q.bias), dtype)


def test_measured_error_of_the_bf16_kernels(linear, weight_only):
    """The figure the tolerance above states, without a bias: |kernel - fp32 reference| is the
    rounding of the fp32 sum to bf16, at most half an ulp (2^-8 of |ref|)."""
    linear.bias = None
    x = torch.randn(64, 256).bfloat16()
    for q in (Int8Linear(linear, torch.bfloat16), Int4Linear(linear, torch.bfloat16)):
        ref = reference(x, q.dequantized())[0]
        ratio = ((q(x).float() - ref).abs() / (HALF_ULP * ref.abs().clamp_min(1e-2))).max().item()
        assert ratio <= 1.0 + 1e-3, (type(q).__name__, ratio)


def w8a8_reference(x: torch.Tensor, q: QuantLinear):
    """float64: (fake_quant(x) @ dequant(w).T + b, the product, |fake_quant(x)| @ |dequant(w)|.T)."""
    xq, w = fake_quant(x), q.dequantized().double()
    product = xq @ w.T
    return product + (0 if q.bias is None else q.bias.double()), product, xq.abs() @ w.abs().T


def int8_rows(q: QuantLinear) -> int | None:
    """From how many rows the module's activations are int8, as configured (before the probe)."""
    return cpu_kernels.W8A8_ROWS if isinstance(q, Int8Linear) else cpu_kernels.W4A8_ROWS


def close_to_w8a8(y: torch.Tensor, x: torch.Tensor, q: QuantLinear, dtype) -> bool:
    """y (M, N) against the W8A8 definition, within its fp32 (and at bf16 the result's) roundings."""
    out, product, bound = w8a8_reference(x, q)
    tol = FP32_W8A8 * (bound + out.abs()) + (HALF_ULP * (product.abs() + out.abs()) if dtype == torch.bfloat16 else 0)
    return bool(((y.double() - out).abs() <= tol).all())


@needs_int8_products
@pytest.mark.parametrize("make", [Int8Linear, Int4Linear], ids=["w8a8", "w4a8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("K", [256, 4864])              # 4864: int32 sums above 2^24 (fp32 rounds them)
def test_w8a8_equals_its_definition(make, dtype, K):
    """From W8A8_ROWS rows: the module's output is fake_quant(x) @ dequant(w).T + b (float64) up to
    the fp32 roundings of the rescale (and bf16's one rounding of the result at bf16). int4's W4A8
    is the same product with int8 codes c * m unpacked from its packed weight."""
    torch.manual_seed(0)
    lin = nn.Linear(K, 96, bias=True)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        lin.bias.normal_(0, 0.1)
    q = make(lin, dtype)
    assert q.w8a8_rows == int8_rows(q) and q.w8a8_rows <= 48
    x = (torch.randn(2, 24, K) * torch.rand(2, 24, 1) * 4).to(dtype)    # rows of varied scale
    x[0, 0] = 0                                                           # an all-zero row: codes 0
    codes, scale = quantize_rows(x.reshape(-1, K))
    assert codes.abs().max() <= 127 and torch.equal(codes[0], torch.zeros(K, dtype=torch.int8))
    assert torch.equal(codes.double() * scale.double()[:, None], fake_quant(x.reshape(-1, K)))
    y = q(x)
    assert y.shape == (2, 24, 96) and y.dtype == dtype
    assert close_to_w8a8(y.reshape(-1, 96), x.reshape(-1, K), q, dtype)
    out, _, bound = w8a8_reference(x.reshape(-1, K), q)
    err = (y.reshape(-1, 96).double() - out).abs()
    if dtype == torch.float32:       # the figure the doc gives: the fp32 rescale's error, in units of 2^-24
        ratio = (err / (2.0 ** -24 * (bound + out.abs()))).max().item()
        assert ratio <= 4, ratio


@pytest.mark.parametrize("make", [Int8Linear, Int4Linear], ids=["int8", "int4"])
def test_linear_switches_path_by_row_count(linear, make):
    """Under W8A8_ROWS rows the weight-only kernel, from W8A8_ROWS on int8 x int8, bit for bit;
    where there are no int8 products (no VNNI: int8_products) weight-only at every row count."""
    q = make(linear, torch.bfloat16)
    n = int8_rows(q)
    assert n is not None and q.w8a8_rows == (n if int8_products() else None)
    for M in (1, n - 1, n, 64):
        x = torch.randn(M, 256).bfloat16()
        weight_only = q.matmul_weight_only(x) + q.bias
        int8 = q.matmul_int8(x) + q.bias if int_mm_exact() else None
        expected = int8 if (M >= n and int8_products()) else weight_only
        assert torch.equal(q(x), expected), M
    if int_mm_exact():      # the two paths differ (the activations' rounding): the switch is seen
        x = torch.randn(n, 256).bfloat16()
        assert not torch.equal(q.matmul_int8(x), q.matmul_weight_only(x))


def test_int_mm_probe_says_what_int_mm_does():
    """int_mm_exact's verdict against a saturating product at a model's shape: rows of +127 times
    +127 columns (oneDNN without VNNI adds 128 to s8 activations and saturates u8 x s8 pairs in
    int16: 255 * 127 * 2 > 32767)."""
    a = torch.full((32, 896), 127, dtype=torch.int8)
    b = torch.randint(-127, 128, (1152, 896), dtype=torch.int8)
    b[:8] = 127
    exact = torch.equal(torch._int_mm(a, b.t()).long(), a.long() @ b.long().t())
    assert exact == int_mm_exact()


def test_w8a8_error_on_random_data_is_what_the_doc_says(linear):
    """The activations' quantization is an error weight-only int8 does not have: relative RMS error
    of a layer's output against the float layer (fp32, the original weight), Gaussian activations."""
    torch.manual_seed(1)
    lin = nn.Linear(896, 896, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
    x = torch.randn(64, 896)
    ref = (x.double() @ lin.weight.double().T)
    rel = lambda y: ((y.double() - ref).norm() / ref.norm()).item()          # noqa: E731
    q = Int8Linear(lin, torch.float32)
    weight_only = rel(torch._weight_int8pack_mm(x, q.weight, q.scales))
    w8a8 = rel(fake_quant(x) @ q.dequantized().double().T)                  # the definition
    assert 0.005 < weight_only < 0.012 and 0.008 < w8a8 < 0.02 and w8a8 > weight_only, (weight_only, w8a8)
    if int8_products():
        assert abs(rel(q(x)) - w8a8) < 1e-5


def test_int8_codes_and_scales_round_trip(linear):
    q = Int8Linear(linear, torch.bfloat16)
    codes, scale = quantize_int8(linear.weight, torch.bfloat16)
    assert torch.equal(q.weight, codes) and torch.equal(q.scales, scale) and q.weight.dtype == torch.int8
    assert codes.abs().max() <= 127
    # read back through the kernel: identity rows at fp32, one product each (exact)
    eye = torch.eye(256)
    read = torch._weight_int8pack_mm(eye, q.weight, q.scales.float()).T
    assert torch.equal(read, codes.float() * scale.float()[:, None])
    # and the quantization is the nearest code under the stored scale
    err = (q.dequantized() - linear.weight.detach()).abs()
    assert (err <= scale.float()[:, None] / 2 * (1 + 1e-3)).all()


def test_int8_embedding_gathers_dequantized_rows_and_shares_them_with_a_tied_head():
    torch.manual_seed(0)
    emb = nn.Embedding(100, 64)
    q = Int8Embedding(emb, torch.bfloat16)
    ids = torch.tensor([[3, 99, 0]])
    expected = (q.dequantized()[ids]).bfloat16()
    assert torch.equal(q(ids), expected) and q.weight.dtype == torch.bfloat16 and q.weight.numel() == 0
    head = q.as_head()
    assert head.weight.data_ptr() == q.qweight.data_ptr()                   # no copy
    h = torch.randn(4, 64).bfloat16()
    if head.w8a8_rows is None:                   # `_int_mm` inexact here: weight-only
        assert close_to_kernel(head(h), reference(h, q.dequantized()), torch.bfloat16)
    else:                                        # the head: W8A8 at every row count
        assert head.w8a8_rows == 1 and close_to_w8a8(head(h), h, head, torch.bfloat16)
