"""DiffusionGemma at 8 and 4 bits (bitsandbytes, on CPU): the published packed experts become
per-expert quantized linears holding exactly the quantization of their own slices; a 4-bit forward
equals the float forward of its dequantized weights; the router stays unquantized; the 26B shape's
memory at every precision, and what fits a 24 GB GPU."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.info import memory_estimate, shape_summary
from fastdllm.testing.tiny_gemma import PUBLISHED_TEXT, write_diffusion_gemma
from fastdllm.models.diffusion_gemma import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
)

bnb = pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.usefixtures("one_thread")
C = 16


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    # sizes that are multiples of 64 where bitsandbytes' bf16 CPU kernel needs them, and some not
    return write_diffusion_gemma(tmp_path_factory.mktemp("ckpt") / "tiny-diffusion-gemma-q", hidden_size=64,
                                 intermediate_size=64, moe_intermediate_size=32, canvas_length=C)


def quantized_layers(model) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))}


@pytest.mark.parametrize("quantize", ["8bit", "4bit"])
def test_experts_hold_the_quantization_of_their_own_slices(gemma_dir, quantize):
    lm = loading.load(gemma_dir, dtype="fp32", quantize=quantize)
    published = load_file(gemma_dir / "model.safetensors")
    inner = lm.model.config.moe_intermediate_size
    for i, layer in enumerate(lm.model.blocks):
        assert type(layer.router.proj) is nn.Linear and layer.router.proj.weight.dtype == torch.float32
        gate_up = published[f"model.decoder.layers.{i}.experts.gate_up_proj"].float()       # (E, 2I, d)
        down = published[f"model.decoder.layers.{i}.experts.down_proj"].float()             # (E, d, I)
        assert len(layer.experts) == gate_up.shape[0]
        for e, expert in enumerate(layer.experts):
            for lin, weight in ((expert.gate_proj, gate_up[e, :inner]), (expert.up_proj, gate_up[e, inner:]),
                                (expert.down_proj, down[e])):
                if quantize == "4bit":
                    data, state = bnb.functional.quantize_4bit(weight, blocksize=lin.weight.blocksize, quant_type="nf4")
                    assert torch.equal(lin.weight.data, data) and torch.equal(lin.weight.quant_state.absmax, state.absmax)
                else:
                    rows, scales, _ = bnb.functional.int8_vectorwise_quant(weight.half())
                    assert torch.equal(lin.weight.data, rows) and torch.equal(lin.weight.SCB, scales)
    # every block matrix is quantized: attention, dense and self-conditioning MLPs, 3 per expert
    c = lm.model.config
    per_layer = {True: 3, False: 4}                      # full layers have no v_proj (k_eq_v)
    expected = sum(per_layer[kind == "full_attention"] + 3 + 3 * c.num_experts for kind in c.layer_types) + 3
    assert len(quantized_layers(lm.model)) == expected


def dequantized(lin: nn.Module) -> torch.Tensor:
    """The float weight a bitsandbytes linear stands for (before its first forward)."""
    w = lin.weight
    if isinstance(lin, bnb.nn.Linear4bit):
        return bnb.functional.dequantize_4bit(w.data, w.quant_state).float()
    return w.data.float() * (w.SCB.float()[:, None] / 127)


def logits(lm, prompt: list[int], canvas: torch.Tensor) -> torch.Tensor:
    model = lm.model
    cache = model.new_cache(torch.ones(1, len(prompt) + C, dtype=torch.bool))
    with torch.no_grad():
        model.encode(torch.tensor([prompt]), 0, cache)
        first = model.denoise(canvas, len(prompt), cache, None)
        return model.denoise(canvas, len(prompt), cache, first)              # self-conditioned


def test_4bit_forward_equals_the_float_forward_of_its_dequantized_weights(gemma_dir):
    """On bitsandbytes' portable 4-bit kernel (every CPU has it; the bf16 one rounds through bf16),
    a 4-bit forward is a float forward of the dequantized weights: equal to fp32 rounding."""
    quantized, floated = (loading.load(gemma_dir, dtype="fp32", quantize="4bit") for _ in range(2))
    for name, lin in quantized_layers(floated.model).items():
        parent, child = name.rsplit(".", 1)
        plain = nn.Linear(lin.in_features, lin.out_features, bias=False)
        plain.weight = nn.Parameter(dequantized(lin), requires_grad=False)
        setattr(floated.model.get_submodule(parent), child, plain)
    for lin in quantized_layers(quantized.model).values():
        lin.support_avx512bf16_for_cpu = False
    assert not quantized_layers(floated.model)
    prompt = quantized.encode("def main():")
    canvas = torch.randint(110, 500, (1, C), generator=torch.Generator().manual_seed(1))
    ours, reference = logits(quantized, prompt, canvas), logits(floated, prompt, canvas)
    assert reference.abs().max() > 1 and (ours - reference).abs().max() <= 1e-5


@pytest.mark.parametrize("quantize", ["8bit", "4bit"])
def test_quantized_generate_and_info(gemma_dir, quantize):
    from cli_runner import invoke

    r = invoke("generate", "-m", gemma_dir, "--quantize", quantize, "-n", str(2 * C), "--no-early-stop", "--json",
            "def main():")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert 0 < len(record["ids"]) <= 2 * C and record["steps_per_canvas"] and record["model"]["quantize"] == quantize
    info = json.loads(invoke("info", gemma_dir, "--json").stdout)
    weights = {k: v["weights"] for k, v in info["memory"].items()}
    assert weights["4bit"] < weights["8bit"] < weights["bf16"]


def test_the_26b_shape_fits_a_24gb_gpu_at_4_bits():
    """`fastdllm info`'s estimate for the published shape (built on the meta device): 25.2B
    parameters, 3.8B active; 8/4-bit quantize the experts too (they are 90% of the weights)."""
    config = DiffusionGemmaConfig(text_config=PUBLISHED_TEXT, canvas_length=256)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in DiffusionGemmaForBlockDiffusion(config).state_dict().items()}
    summary = shape_summary(shapes, config)
    assert 25.0e9 < summary["parameters"] < 25.5e9 and 3.7e9 < summary["active_parameters"] < 4.0e9
    assert summary["block_matrix_parameters"] > 0.9 * summary["parameters"]
    gib = {k: v["total"] / 2**30 for k, v in memory_estimate(summary, 128 + 256).items()}
    # 47.1 / 24.3 / 14.3 GiB with a 384-token canvas: only 4-bit leaves room on a 24 GB GPU
    assert gib["bf16"] > gib["8bit"] > 24 > gib["4bit"] + 1
