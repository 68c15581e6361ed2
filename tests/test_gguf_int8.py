"""Q8_0 kept quantized (`--quantize int8` on a GGUF file; checkpoints/gguf_int8.py, docs/gguf.md 10):
the block linears' int8 rows are fastdllm's per-row quantization of the gguf package's float32
dequantization, made without a float copy of those weights, and the error of that re-quantization
stays within half an int8 step of the row."""

from __future__ import annotations

import json

import pytest
import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.models.cpu_quant import Int8Linear, quantize_int8

from gguf_writer import converter_permute, folder_weights, write_gguf

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.fast
Q8_0 = gguf.GGMLQuantizationType.Q8_0


@pytest.fixture(scope="module")
def q8_file(llada_dir, tmp_path_factory):
    return write_gguf(llada_dir, tmp_path_factory.mktemp("gguf8") / "tiny-llada-Q8_0.gguf", "Q8_0")


def test_int8_rows_are_the_per_row_quantization_of_the_packages_dequantization(llada_dir, q8_file):
    lm = loading.load(resolve_model_dir(str(q8_file)), dtype="bf16", quantize="int8")
    assert "14 block linears from Q8_0" in lm.info["gguf_int8"]
    config = json.loads((llada_dir / "config.json").read_text())
    for i, block in enumerate(lm.model.model.transformer.blocks):
        for name in ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"):
            lin = getattr(block, name)
            assert type(lin) is Int8Linear, name
            w = folder_weights(llada_dir)[f"model.transformer.blocks.{i}.{name}.weight"].float().numpy()
            heads = {"q_proj": config["n_heads"], "k_proj": config["n_kv_heads"]}.get(name)
            on_disk = converter_permute(w, heads) if heads else w            # the converter's row order
            deq = gguf.quants.dequantize(gguf.quants.quantize(on_disk, Q8_0), Q8_0)
            if heads:                                                        # back to the published order
                deq = deq.reshape(heads, -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
            q, scale = quantize_int8(torch.from_numpy(np.ascontiguousarray(deq)), torch.bfloat16)
            assert torch.equal(lin.weight, q) and torch.equal(lin.scales, scale), name
            # one new rounding: within half a step of the row (scale / 2, plus the bf16 scale's rounding)
            err = (lin.dequantized() - torch.from_numpy(deq)).abs().amax(1)
            assert bool((err <= scale.float() * 0.5 * (1 + 2 ** -7) + 1e-9).all()), name
            assert not torch.equal(lin.dequantized(), torch.from_numpy(deq)), name     # re-quantized, not exact


def test_no_float_copy_of_the_kept_weights(q8_file, llada_dir):
    from fastdllm.checkpoints.gguf_int8 import state_dict_int8

    config = json.loads((llada_dir / "config.json").read_text())
    weights, codes = state_dict_int8(q8_file, config, torch.bfloat16)
    assert len(codes) == 14
    for name in codes:                              # stand-ins: one element of storage each
        assert weights[name].untyped_storage().nbytes() <= 2 and weights[name].stride() == (0, 0), name
    assert weights["model.transformer.wte.weight"].stride() != (0, 0)     # the embedding: fastdllm's int8 makes it


def test_int8_from_the_file_is_as_close_to_q8_0_as_int8_through_bf16(llada_dir, q8_file, tmp_path):
    """Reference: the Q8_0 weights dequantized, fp32. The old route (a folder of those weights loaded
    in bf16, then --quantize int8) rounds twice, the file's route once; its logits are as close (within 5%: measured 0.054 vs
    0.053 relative rms on the tiny model, bf16 compute and int8 activations dominate both)."""
    from gguf_writer import round_tripped

    ref = loading.load(resolve_model_dir(str(q8_file)), dtype="fp32")
    lm = loading.load(resolve_model_dir(str(q8_file)), dtype="bf16", quantize="int8")
    twin = loading.load(round_tripped(llada_dir, tmp_path / "rt", "Q8_0"), dtype="bf16", quantize="int8")
    ids = torch.tensor([lm.encode("What is 2 + 2?", chat=True) + [lm.specials.mask] * 8])
    with torch.no_grad():
        want, got, old = (m.model(ids).logits.float() for m in (ref, lm, twin))
    err, err_old = ((x - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt() for x in (got, old))
    print(f"relative rms logit error vs fp32 Q8_0: int8 from the file {err:.4f}, int8 through bf16 {err_old:.4f}")
    assert err <= err_old * 1.05 and err < 0.1


def test_info_states_what_int8_does_with_q8_0(q8_file):
    from cli_runner import invoke

    r = invoke("info", "-m", q8_file, "--json")
    assert r.exit_code == 0, r.stderr
    assert "--quantize int8: Q8_0 re-quantized per row" in json.loads(r.stdout)["dtype_on_disk"]


@pytest.mark.parametrize("arch, linears", [("dream", 14), ("rnd1", 56)])
def test_qwen_families_keep_q8_0_as_int8(dream_dir, tmp_path, arch, linears):
    """Dream's 7 linears a layer; RND1's 4 attention + 8 experts x 3 (the router stays float)."""
    from fastdllm.testing.tiny_rnd1 import write_rnd1

    from test_gguf_families import write_qwen_gguf

    src = dream_dir if arch == "dream" else write_rnd1(tmp_path / "rnd1", dtype=torch.float32)
    path = write_qwen_gguf(src, tmp_path / f"tiny-{arch}-Q8_0.gguf", arch, "Q8_0")
    lm = loading.load(resolve_model_dir(str(path)), dtype="bf16", quantize="int8")
    ref = loading.load(resolve_model_dir(str(path)), dtype="fp32")
    assert lm.info["gguf_int8"].startswith(f"{linears} block linears from Q8_0")
    routers = [m for n, m in lm.model.named_modules() if n.endswith("mlp.gate")]
    assert all(not isinstance(m, Int8Linear) for m in routers) and (arch == "dream" or routers)
    ids = torch.tensor([lm.encode("Hi there", chat=False) + [lm.specials.mask] * 4])
    with torch.no_grad():
        got, want = lm.model(ids).logits.float(), ref.model(ids).logits
    assert float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()) < 0.1
