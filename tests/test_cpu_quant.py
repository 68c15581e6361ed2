"""--quantize int8 / int4 (models/cpu_quant.py): the kernels against float matmuls of the weights they
stand for, the packed weights read back, whole models, the CLI, bad input.

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

import json

import pytest
import torch
from conftest import VARIED
from test_cli import SMALL, invoke
from torch import nn

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.placement import cpu_quant_check
from fastdllm.checkpoints.tiny_random import write_dream
from fastdllm.errors import UserError
from fastdllm.models import FAMILIES, cpu_quant
from fastdllm.models.cpu_quant import (
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    QuantLinear,
    dequantize_int4,
    int_mm_exact,
    quantize_int4,
    quantize_int8,
    quantize_model,
    quantize_rows,
)

HALF_ULP = 2.0 ** -8           # bf16's half ulp relative to a value, at most (7 stored mantissa bits)
FP32_W8A8 = 2.0 ** -22         # the W8A8 path's fp32 roundings (int32 -> fp32, two scale products, bias)
needs_exact_int_mm = pytest.mark.skipif(not int_mm_exact(), reason="torch._int_mm saturates here (no VNNI): W8A8 off")


@pytest.fixture
def weight_only(monkeypatch):
    """Int8Linear built in the test runs the weight-only kernel at every row count."""
    monkeypatch.setattr(cpu_quant, "W8A8_ROWS", None)


def fake_quant(x: torch.Tensor) -> torch.Tensor:
    """The W8A8 definition's activations, float64: per row s = max|x| / 127 (fp32), q = round(x / s)
    in fp32, clamped to +-127; returns q * s."""
    xf = x.float()
    s = (xf.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30)
    return torch.round(xf / s).clamp(-127, 127).double() * s.double()


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
@pytest.mark.parametrize("make", [Int8Linear, lambda lin, dt: Int4Linear(lin, dt, 32), lambda lin, dt: Int4Linear(lin, dt, 64),
                                  lambda lin, dt: Int4Linear(lin, dt, 128)], ids=["int8", "int4-g32", "int4-g64", "int4-g128"])
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
    for q in (Int8Linear(linear, torch.bfloat16), Int4Linear(linear, torch.bfloat16, 64)):
        ref = reference(x, q.dequantized())[0]
        ratio = ((q(x).float() - ref).abs() / (HALF_ULP * ref.abs().clamp_min(1e-2))).max().item()
        assert ratio <= 1.0 + 1e-3, (type(q).__name__, ratio)


def w8a8_reference(x: torch.Tensor, q: Int8Linear):
    """float64: (fake_quant(x) @ dequant(w).T + b, the product, |fake_quant(x)| @ |dequant(w)|.T)."""
    xq, w = fake_quant(x), q.dequantized().double()
    product = xq @ w.T
    return product + (0 if q.bias is None else q.bias.double()), product, xq.abs() @ w.abs().T


@needs_exact_int_mm
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("K", [256, 4864])              # 4864: int32 sums above 2^24 (fp32 rounds them)
def test_w8a8_equals_its_definition(dtype, K):
    """From W8A8_ROWS rows: the module's output is fake_quant(x) @ dequant(w).T + b (float64) up to
    the fp32 roundings of the rescale (and bf16's one rounding of the result at bf16)."""
    torch.manual_seed(0)
    lin = nn.Linear(K, 96, bias=True)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        lin.bias.normal_(0, 0.1)
    q = Int8Linear(lin, dtype)
    assert q.w8a8_rows == cpu_quant.W8A8_ROWS
    x = (torch.randn(2, 20, K) * torch.rand(2, 20, 1) * 4).to(dtype)    # rows of varied scale
    x[0, 0] = 0                                                           # an all-zero row: codes 0
    codes, scale = quantize_rows(x.reshape(-1, K))
    assert codes.abs().max() <= 127 and torch.equal(codes[0], torch.zeros(K, dtype=torch.int8))
    assert torch.equal(codes.double() * scale.double()[:, None], fake_quant(x.reshape(-1, K)))
    y = q(x)
    assert y.shape == (2, 20, 96) and y.dtype == dtype
    out, product, bound = w8a8_reference(x.reshape(-1, K), q)
    err = (y.reshape(-1, 96).double() - out).abs()
    tol = FP32_W8A8 * (bound + out.abs()) + (HALF_ULP * (product.abs() + out.abs()) if dtype == torch.bfloat16 else 0)
    assert (err <= tol).all(), (err / tol).max().item()
    if dtype == torch.float32:       # the figure the doc gives: the fp32 rescale's error, in units of 2^-24
        ratio = (err / (2.0 ** -24 * (bound + out.abs()))).max().item()
        assert ratio <= 4, ratio


def test_int8_linear_switches_path_by_row_count(linear):
    """Under W8A8_ROWS rows the weight-only kernel, from W8A8_ROWS on int8 x int8, bit for bit;
    where `_int_mm` is not exact (no VNNI) weight-only at every row count."""
    q = Int8Linear(linear, torch.bfloat16)
    n = cpu_quant.W8A8_ROWS
    assert n is not None and q.w8a8_rows == (n if int_mm_exact() else None)
    for M in (1, n - 1, n, 64):
        x = torch.randn(M, 256).bfloat16()
        weight_only = torch._weight_int8pack_mm(x, q.weight, q.scales) + q.bias
        w8a8 = q.matmul_w8a8(x) + q.bias if int_mm_exact() else None
        expected = w8a8 if (M >= n and int_mm_exact()) else weight_only
        assert torch.equal(q(x), expected), M
    if int_mm_exact():      # the two paths differ (the activations' rounding): the switch is seen
        x = torch.randn(n, 256).bfloat16()
        assert not torch.equal(q.matmul_w8a8(x), torch._weight_int8pack_mm(x, q.weight, q.scales))


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
    if int_mm_exact():
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


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_packed_weight_round_trips(linear, group):
    q = Int4Linear(linear, torch.bfloat16, group)
    codes, sz = quantize_int4(linear.weight, group, torch.bfloat16)
    assert codes.min() >= 0 and codes.max() <= 15 and sz.shape == (256 // group, 96, 2)
    assert torch.equal(q.scales_and_zeros, sz) and q.weight.dtype == torch.uint8 and q.weight.numel() == 96 * 128
    expected = dequantize_int4(codes, sz, group)
    assert torch.allclose(q.dequantized(), expected, rtol=0, atol=1e-6)    # what the kernel unpacks
    err = (expected - linear.weight.detach()).abs().view(96, -1, group)
    assert (err <= sz[..., 0].T.float()[..., None] / 2 * 1.01 + 1e-6).all()   # nearest code, half a step


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
    assert close_to_kernel(head(h), reference(h, q.dequantized()), torch.bfloat16)


def dequantized_twin(path, quant: nn.Module) -> nn.Module:
    """The model at `path` in fp32, each weight that `quant` quantized replaced by the float weight
    it stands for: the whole-model plumbing against plain float modules."""
    twin = loading.load(path, dtype="fp32", pack_weights=False).model
    for name, module in quant.named_modules():
        if isinstance(module, (QuantLinear, Int8Embedding)):
            twin.get_submodule(name).weight.data = module.dequantized()
    if isinstance(quant.embed, Int8Embedding):
        twin.embed.weight.data = quant.embed.dequantized()      # also a tied head's weight
    for name, module in quant.named_modules():                  # W8A8: its activations too
        if isinstance(module, Int8Linear) and module.w8a8_rows is not None:
            rows = module.w8a8_rows
            twin.get_submodule(name).register_forward_pre_hook(
                lambda _, args, rows=rows: (fake_quant(args[0]).to(args[0].dtype),)
                if args[0].reshape(-1, args[0].shape[-1]).shape[0] >= rows else None)
    return twin


@pytest.mark.parametrize("fmt", ["int8", "int4", pytest.param("int8-weight-only", id="int8-weight-only")])
@pytest.mark.parametrize("head", [False, True])
def test_whole_model_quantized_equals_its_dequantized_float_twin(fmt, head, tmp_path, monkeypatch):
    """int8 at 48 rows runs W8A8 where `_int_mm` is exact: the twin quantizes those linears'
    activations as the definition says (fake_quant); int8-weight-only: W8A8 off."""
    if fmt == "int8-weight-only":
        monkeypatch.setattr(cpu_quant, "W8A8_ROWS", None)
        fmt = "int8"
    path = write_dream(tmp_path / "dream", hidden_size=64, intermediate_size=128, **VARIED)
    quant = loading.load(path, dtype="fp32", pack_weights=False).model
    done = quantize_model(quant, fmt, torch.float32, head=head, embedding=True)
    twin = dequantized_twin(path, quant)
    assert done["linears"] == 2 * 4 and done["kept"] == 0 and done["embedding"] == "int8"
    assert ("head" in done) == head and quant.is_quantized
    ids = torch.randint(0, 500, (2, 24))
    with torch.no_grad():
        a, b = quant(ids).logits, twin(ids).logits
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_tied_head_is_the_embeddings_int8_rows(llada_dir):
    lm = loading.load(llada_dir, dtype="fp32", pack_weights=False)
    config_cls, model_cls, _ = FAMILIES["llada"][0]
    tied = model_cls(config_cls.from_dict({**lm.model.config.to_dict(), "weight_tying": True})).eval()
    tied.prepare_for_inference(pack=False)
    done = quantize_model(tied, "int4", torch.float32, head=True)
    assert done["head"].startswith("int8 (tied") and tied.output_head.weight.data_ptr() == tied.embed.qweight.data_ptr()
    h = torch.randn(1, 3, tied.config.d_model)
    assert torch.allclose(tied.head(h), h @ tied.embed.dequantized().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int8", "int4", "int8-weight-only"])
def test_loaded_bf16_model_is_close_to_its_float_twin(fmt, tmp_path, monkeypatch):
    """In bf16 (the default) the activations are rounded at every layer: the weight-only quantized
    model is as far from its dequantized fp32 twin as the float model in bf16 is from itself in fp32
    (these random weights, std 0.3, make that noise large), not further (x1.5). With W8A8 (int8 at
    these 96 rows, where `_int_mm` is exact) the twin quantizes its activations too (fake_quant), and
    the allowance is x2.5: the activations' rounding to codes is discontinuous, so the bf16 noise of
    a linear's input moves some codes by a whole step (measured: 1.8-2.0x, the weight-only 1.1x)."""
    if fmt == "int8-weight-only":
        monkeypatch.setattr(cpu_quant, "W8A8_ROWS", None)
    path = write_dream(tmp_path / "dream", hidden_size=64, intermediate_size=128, **VARIED)
    lm = loading.load(path, quantize=fmt.split("-")[0])
    assert lm.dtype == torch.bfloat16 and lm.info["cpu_quantized"]["linears"] == 8 and lm.model.is_quantized
    twin = dequantized_twin(path, lm.model)
    bf16, fp32 = (loading.load(path, dtype=d).model for d in ("bf16", "fp32"))
    ids = torch.randint(0, 500, (4, 24))
    w8a8 = fmt == "int8" and int_mm_exact()
    with torch.no_grad():
        quantized = (lm.model(ids).logits.float() - twin(ids).logits).abs().mean()
        noise = (bf16(ids).logits.float() - fp32(ids).logits).abs().mean()
    assert quantized < (2.5 if w8a8 else 1.5) * noise, (quantized.item(), noise.item())


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_generate_through_the_cli(fmt, tmp_path):
    path = write_dream(tmp_path / "dream", hidden_size=64, intermediate_size=128, **VARIED)
    r = invoke("generate", "-m", path, *SMALL, "--json", "--quantize", fmt, "Hi")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["model"]["quantize"] == fmt and record["model"]["dtype"] == "bfloat16"
    assert record["generated_tokens"] > 0 and record["nfe"] >= 2


def test_llada_generates_with_int8_and_is_smaller(llada_dir):
    sizes = {}
    for fmt in ("none", "int8", "int4"):
        r = invoke("generate", "-m", llada_dir, *SMALL, "--json", "--dtype", "bf16", "--quantize", fmt, "Hi")
        assert r.exit_code == 0, r.stderr
        sizes[fmt] = json.loads(r.stdout)["model"]["weights_bytes"]
    assert sizes["int4"] < sizes["int8"] < sizes["none"]


@pytest.mark.parametrize("args, message", [
    (["--quantize", "int3"], "unknown quantize 'int3' (expected one of none, int8, int4, 8bit, 4bit)"),
    (["--quantize", "int8", "--dtype", "fp16"], "--quantize int8 computes in bf16 (default) or fp32, not --dtype fp16"),
])
def test_bad_input_is_one_line(llada_dir, args, message):
    r = invoke("generate", "-m", llada_dir, *args, "Hi")
    assert r.exit_code in (1, 2) and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_gpu_placement_is_refused_with_the_gpu_formats_named():
    with pytest.raises(UserError, match="CPU kernels only, not for a GPU: use --quantize 4bit"):
        cpu_quant_check("int4", "auto", "auto")
    with pytest.raises(UserError, match="not for --device cuda:1: use --quantize 8bit"):
        cpu_quant_check("int8", "auto", {"": "cuda:1"})


def test_bitsandbytes_on_cpu_says_int8_int4_are_the_cpu_formats(llada_dir):
    pytest.importorskip("bitsandbytes")
    r = invoke("generate", "-m", llada_dir, *SMALL, "--quantize", "8bit", "--dtype", "bf16", "Hi")
    assert r.exit_code == 0, r.stderr
    assert sum("bitsandbytes 8bit/4bit compute slower than fp32 on a CPU" in line for line in r.stderr.splitlines()) == 1


def test_moe_experts_are_quantized(tmp_path):
    from fastdllm.checkpoints.tiny_moe import write_llada_moe

    lm = loading.load(write_llada_moe(tmp_path / "moe"), quantize="int8")
    experts = [m for n, m in lm.model.named_modules() if ".experts." in n and isinstance(m, Int8Linear)]
    assert experts and lm.info["cpu_quantized"]["kept"] == 0
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(lm.model(ids).logits).all()


def test_packed_experts_are_refused_in_one_line(tmp_path):
    from fastdllm.checkpoints.tiny_gemma import write_diffusion_gemma

    path = write_diffusion_gemma(tmp_path / "gemma")
    with pytest.raises(UserError, match="experts are packed 3-D tensors"):
        loading.load(path, quantize="int4")
