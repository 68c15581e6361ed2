"""Code that branches on what this CPU can do must be right on every kind of CPU (AVX2 only,
AVX-512 without bf16, AVX-512 with bf16 units). Here: bitsandbytes' 4-bit layers, which repack their
weights for an AVX-512-bf16 kernel where the CPU has one, and fail on shapes that kernel cannot take
(fastdllm keeps those on bitsandbytes' portable kernel: models.layers.keep_4bit_portable)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_random import FIXTURES
from fastdllm.models.layers import cpu_4bit_packable, keep_4bit_portable

bnb = pytest.importorskip("bitsandbytes")

SHAPES = [(96, 64), (128, 64), (128, 48), (64, 32)]          # (in, out): packable iff in % 64 == 0 and out % 32 == 0


def four_bit(in_features: int, out_features: int, seed: int = 0):
    """A bitsandbytes nf4 Linear on CPU, in inference mode, and the dequantized weight it holds."""
    torch.manual_seed(seed)
    dense = nn.Linear(in_features, out_features, bias=False)
    lin = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(dense.weight.data.clone(), requires_grad=False, quant_type="nf4", module=lin)
    lin = lin.to("cpu").eval()
    return lin, bnb.functional.dequantize_4bit(lin.weight.data, lin.weight.quant_state).float()


def test_the_packing_rule():
    assert [cpu_4bit_packable(o, i) for i, o in SHAPES] == [False, True, False, True]
    assert not cpu_4bit_packable(64, 96, blocksize=128) and cpu_4bit_packable(64, 256, blocksize=128)


@pytest.mark.parametrize("in_features, out_features", SHAPES)
def test_the_decision_as_on_a_cpu_with_bf16_units(in_features, out_features):
    """Whatever this CPU is: where bitsandbytes would repack (its flag set), an unpackable layer is
    switched to the portable kernel and a packable one is left alone; where it would not, nothing."""
    for would_pack in (True, False):
        lin, _ = four_bit(in_features, out_features)
        lin.support_avx512bf16_for_cpu = would_pack
        changed = keep_4bit_portable(lin)
        packable = cpu_4bit_packable(out_features, in_features)
        assert changed == (would_pack and not packable)
        assert bool(lin.support_avx512bf16_for_cpu) == (would_pack and packable)


@pytest.mark.parametrize("in_features, out_features", SHAPES)
def test_every_shape_runs_on_this_cpu_as_the_dequantized_weight(in_features, out_features):
    """On this CPU's own path (packed where it has bf16 units and the shape packs, portable
    elsewhere) the layer computes x @ W^T of its 4-bit weight, to bf16 rounding."""
    lin, weight = four_bit(in_features, out_features)
    keep_4bit_portable(lin)
    x = torch.randn(5, in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        y = lin(x).float()
    expected = x.float() @ weight.T
    assert torch.allclose(y, expected, rtol=0, atol=0.02 * float(expected.abs().max()))
    packed = getattr(lin.weight.quant_state, "packing_format_for_cpu", False)
    assert not packed or cpu_4bit_packable(out_features, in_features)


@pytest.mark.parametrize("name", ["LLaDA-8B-Instruct", "Dream-v0-Instruct-7B", "LLaDA2.1-mini", "LLaDA-MoE-7B-A1B-Instruct"])
def test_every_linear_of_the_published_checkpoints_packs(name):
    """The decision never touches a real checkpoint: every linear bitsandbytes quantizes in the
    published configs (built on the meta device: shapes only) has a shape the bf16 kernel takes."""
    path = FIXTURES / name
    config, model_cls, _ = loading.family_of(loading.read_config(path), path)
    with torch.device("meta"):
        model = model_cls(config)
    shapes = {(m.out_features, m.in_features) for m in model.blocks.modules() if isinstance(m, nn.Linear)}
    assert len(shapes) >= 3 and all(cpu_4bit_packable(o, i) for o, i in shapes), shapes


# The other published families' sizes (hidden, MLP, q heads x head_dim, kv heads x head_dim), from
# their config.json: SDAR 1.7B / 4B / 8B Chat, Fast-dLLM v2 1.5B / 7B (= Qwen2.5), SDAR-30B-A3B's experts.
PUBLISHED_SIZES = {"SDAR-1.7B-Chat": (2048, 6144, 16 * 128, 8 * 128), "SDAR-4B-Chat": (2560, 9728, 32 * 128, 8 * 128),
                   "SDAR-8B-Chat": (4096, 12288, 32 * 128, 8 * 128), "Fast_dLLM_v2_1.5B": (1536, 8960, 1536, 256),
                   "Fast_dLLM_v2_7B": (3584, 18944, 3584, 512), "SDAR-30B-A3B-Chat experts": (2048, 768, 32 * 128, 4 * 128)}


@pytest.mark.parametrize("name", PUBLISHED_SIZES)
def test_the_other_published_sizes_pack(name):
    d, mlp, q, kv = PUBLISHED_SIZES[name]
    shapes = [(q, d), (kv, d), (d, q), (mlp, d), (d, mlp)]          # q/k/v/o, gate/up/down as (out, in)
    assert all(cpu_4bit_packable(o, i) for o, i in shapes)
