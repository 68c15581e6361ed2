"""--quantize int8 / int4 on whole models (models/cpu_quant.py): each against its float twin (the
dequantized weights, and where W8A8/W4A8 runs the activations fake-quantized too), the head by
default, the CLI, memory, bad input. The kernels themselves: tests/quant/test_cpu_quant.py."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import VARIED
from cli_runner import invoke
from helpers import SMALL, fake_quant
from torch import nn

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.info import inspect_checkpoint, memory_estimate
from fastdllm.checkpoints.placement import cpu_quant_check
from fastdllm.errors import UserError
from fastdllm.models import FAMILIES, cpu_kernels
from fastdllm.models.cpu_kernels import QuantLinear, int8_products
from fastdllm.models.cpu_quant import Int8Embedding, Int8Linear, quantize_model


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)
DREAM_H64 = dict(hidden_size=64, intermediate_size=128, **VARIED)     # tests/conftest.py tiny(); read only


def dequantized_twin(path, quant: nn.Module, seen: dict | None = None) -> nn.Module:
    """The model at `path` in fp32, each weight that `quant` quantized replaced by the float weight
    it stands for: the whole-model plumbing against plain float modules. Where W8A8 runs, the twin's
    linears quantize their activations as the definition says (fake_quant); with `seen` (w8a8_inputs)
    from the input `quant` itself had, after checking that their own is that one to rounding: a
    code at a rounding tie can fall either way between two sums in a different order, and one code
    a step off moves the logits far past any tolerance (about 1 input in 4 at these shapes)."""
    twin = loading.load(path, dtype="fp32", pack_weights=False).model
    for name, module in quant.named_modules():
        if isinstance(module, (QuantLinear, Int8Embedding)):
            twin.get_submodule(name).weight.data = module.dequantized()
    if isinstance(quant.embed, Int8Embedding):
        twin.embed.weight.data = quant.embed.dequantized()      # also a tied head's weight
    for name, rows in w8a8_linears(quant):

        def activations(_, args, name=name, rows=rows):
            x = args[0]
            if x.reshape(-1, x.shape[-1]).shape[0] < rows:
                return None
            if seen is not None:
                torch.testing.assert_close(x, seen[name].to(x.dtype), rtol=1e-4, atol=1e-4 * x.abs().max().item())
                x = seen[name].to(x.dtype)
            return (fake_quant(x).to(x.dtype),)
        twin.get_submodule(name).register_forward_pre_hook(activations)
    return twin


def w8a8_linears(model: nn.Module) -> list[tuple[str, int]]:
    return [(name, m.w8a8_rows) for name, m in model.named_modules()
            if isinstance(m, QuantLinear) and m.w8a8_rows is not None]


def w8a8_inputs(model: nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """name -> the input each W8A8 linear of `model` had in its forward on `ids`."""
    seen, hooks = {}, []
    for name, _ in w8a8_linears(model):
        hooks.append(model.get_submodule(name).register_forward_pre_hook(
            lambda _, args, name=name: seen.__setitem__(name, args[0].detach().clone())))
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("fmt", ["int8", "int4", "int8-weight-only", "int4-weight-only"])
@pytest.mark.parametrize("head", [False, True])
def test_whole_model_quantized_equals_its_dequantized_float_twin(fmt, head, tiny, monkeypatch):
    """int8/int4 at 48 rows run W8A8/W4A8 where `_int_mm` is exact: the twin quantizes those
    linears' activations as the definition says (fake_quant); -weight-only: that path off."""
    if fmt.endswith("-weight-only"):
        monkeypatch.setattr(cpu_kernels, "W8A8_ROWS", None)
        monkeypatch.setattr(cpu_kernels, "W4A8_ROWS", None)
        fmt = fmt.split("-")[0]
    path = tiny("dream", **DREAM_H64)
    quant = loading.load(path, dtype="fp32", pack_weights=False).model
    done = quantize_model(quant, fmt, torch.float32, head=head, embedding=True)
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    twin = dequantized_twin(path, quant, w8a8_inputs(quant, ids))
    assert done["linears"] == 2 * 4 and done["kept"] == 0 and done["embedding"] == "int8"
    assert ("head" in done) == head and quant.is_quantized
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
    x = h if tied.output_head.w8a8_rows is None else fake_quant(h).float()     # W8A8 where exact
    assert torch.allclose(tied.head(h), x @ tied.embed.dequantized().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int8", "int4", "int8-weight-only", "int4-weight-only"])
def test_loaded_bf16_model_is_close_to_its_float_twin(fmt, tiny, monkeypatch):
    """In bf16 (the default) the activations are rounded at every layer: the weight-only quantized
    model is as far from its dequantized fp32 twin as the float model in bf16 is from itself in fp32
    (these random weights, std 0.3, make that noise large), not further (x1.5). With W8A8 (int8 at
    these 96 rows, and int4's W4A8, where `_int_mm` is exact) the twin quantizes its activations too (fake_quant), and
    the allowance is x2.5: the activations' rounding to codes is discontinuous, so the bf16 noise of
    a linear's input moves some codes by a whole step (measured: 1.8-2.0x, the weight-only 1.1x)."""
    if fmt.endswith("-weight-only"):
        monkeypatch.setattr(cpu_kernels, "W8A8_ROWS", None)
        monkeypatch.setattr(cpu_kernels, "W4A8_ROWS", None)
    path = tiny("dream", **DREAM_H64)
    lm = loading.load(path, quantize=fmt.split("-")[0])
    assert lm.dtype == torch.bfloat16 and lm.info["cpu_quantized"]["linears"] == 8 and lm.model.is_quantized
    twin = dequantized_twin(path, lm.model)
    bf16, fp32 = (loading.load(path, dtype=d).model for d in ("bf16", "fp32"))
    ids = torch.randint(0, 500, (4, 24), generator=torch.Generator().manual_seed(0))
    w8a8 = fmt in ("int8", "int4") and int8_products()
    with torch.no_grad():
        quantized = (lm.model(ids).logits.float() - twin(ids).logits).abs().mean()
        noise = (bf16(ids).logits.float() - fp32(ids).logits).abs().mean()
    assert quantized < (2.5 if w8a8 else 1.5) * noise, (quantized.item(), noise.item())


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_generate_through_the_cli(fmt, tiny):
    path = tiny("dream", **DREAM_H64)
    r = invoke("generate", "-m", path, *SMALL, "--json", "--quantize", fmt, "Hi")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["model"]["quantize"] == fmt and record["model"]["dtype"] == "bfloat16"
    assert record["generated_tokens"] > 0 and record["nfe"] >= 2


@pytest.mark.slow
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


@pytest.mark.slow
def test_bitsandbytes_on_cpu_says_int8_int4_are_the_cpu_formats(llada_dir):
    pytest.importorskip("bitsandbytes")
    r = invoke("generate", "-m", llada_dir, *SMALL, "--quantize", "8bit", "--dtype", "bf16", "Hi")
    assert r.exit_code == 0, r.stderr
    assert sum("bitsandbytes 8bit/4bit compute slower than fp32 on a CPU" in line for line in r.stderr.splitlines()) == 1


def test_moe_experts_are_quantized(tmp_path):
    from fastdllm.testing.tiny_moe import write_llada_moe

    lm = loading.load(write_llada_moe(tmp_path / "moe"), quantize="int8")
    experts = [m for n, m in lm.model.named_modules() if ".experts." in n and isinstance(m, Int8Linear)]
    assert experts and lm.info["cpu_quantized"]["kept"] == 0
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(lm.model(ids).logits).all()


def test_packed_experts_are_refused_in_one_line(tmp_path):
    from fastdllm.testing.tiny_gemma import write_diffusion_gemma

    path = write_diffusion_gemma(tmp_path / "gemma")
    with pytest.raises(UserError, match="experts are packed 3-D tensors"):
        loading.load(path, quantize="int4")


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_the_head_is_int8_by_default_where_w8a8_runs(fmt, tiny):
    """Both formats quantize the output head as int8, W8A8 from one row, where `_int_mm` is exact;
    elsewhere it stays bf16 (a weight-only int8 head is slower than bf16 at a step's rows)."""
    path = tiny("dream", **DREAM_H64)
    lm = loading.load(path, quantize=fmt)
    head = lm.model.output_head
    if int8_products():
        assert lm.info["cpu_quantized"]["head"].startswith("int8")
        assert isinstance(head, Int8Linear) and head.w8a8_rows == 1
    else:
        assert "head" not in lm.info["cpu_quantized"] and not isinstance(head, QuantLinear)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_memory_estimate_is_what_a_quantized_model_holds(fmt, tiny):
    """`fastdllm info`'s estimate (checkpoints/info.py) against the bytes of a loaded model's
    tensors; the estimate leaves out the per-row scales (here the two 152064-row vocab matrices'
    bf16 scales, 3% of this tiny model)."""
    path = tiny("dream", **DREAM_H64)
    model = loading.load(path, quantize=fmt).model
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    estimate = memory_estimate(inspect_checkpoint(path), 0)[fmt]["weights"]
    assert 1.0 <= held / estimate < 1.04, (held, estimate)
