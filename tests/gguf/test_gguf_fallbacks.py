"""The types llama-quantize falls back to where a row is not a multiple of 256 (docs/specs/gguf.md 4, 11):
Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K (llama-quant.cpp's tensor_type_fallback), and Q4_1 (a
Q4_0 file's first ffn_down layers with an imatrix). Read as the gguf package dequantizes them; kept
quantized on a CPU: Q4_1 into int4, Q5_0 / Q5_1 (and Q8_0 beside 4-bit types) into int8 rows, each
fastdllm's quantization of the package's dequantization. Files written with the gguf writer."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import invoke
from helpers import SMALL

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.models.cpu_int4 import Int4Linear, dequantize_int4, quantize_int4
from fastdllm.models.cpu_quant import Int8Linear, quantize_int8

from conftest import VARIED
from gguf_decode import decode, decode_qwen

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from gguf_writer import assert_read_as_round_trip, round_tripped, write_gguf  # noqa: E402  (after the skip)
from gguf_writer import LINEARS, packages_dequantization  # noqa: E402

pytestmark = pytest.mark.fast
FALLBACKS = ("Q4_1", "Q5_0", "Q5_1")
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}      # llama-quant.cpp's tensor_type_fallback
GGUF_LINEAR = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "attn_out": "attn_output",
               "ff_proj": "ffn_gate", "up_proj": "ffn_up", "ff_out": "ffn_down"}


def small_q4_k_m(name: str) -> str:
    """llama-quantize's Q4_K_M on the tiny LLaDA of `narrow`: rows of 64 everywhere but ffn_down (256).
    The output head of 64-wide rows is Q8_0 (its own rule); every other 64-wide tensor takes the
    fallback of its k-quant."""
    if name == "output.weight":
        return "Q8_0"
    want = {"blk.0.attn_v.weight": "Q5_K", "blk.1.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K"}.get(name, "Q4_K")
    return want if "ffn_down" in name else FALLBACK[want]


@pytest.fixture(scope="module")
def narrow(tiny):
    """The tiny LLaDA (d_model 64) with an MLP of 256: ffn_down's rows hold one k-quant super-block."""
    return tiny("llada", **VARIED, mlp_hidden_size=256)


@pytest.fixture(scope="module")
def files(llada_dir, narrow, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-fallbacks")
    out = {t: write_gguf(llada_dir, root / f"tiny-llada-{t}.gguf", t) for t in FALLBACKS}
    out["Q4_K_M"] = write_gguf(narrow, root / "tiny-llada-Q4_K_M.gguf", small_q4_k_m)
    return out


@pytest.mark.parametrize("qtype", FALLBACKS)
def test_weights_are_the_packages_dequantization(llada_dir, files, qtype):
    """Every 2-D tensor as the gguf package dequantizes the file's blocks (q/k rows put back: the
    blocks run along rows, so the row order does not change them), the norms as they were."""
    assert_read_as_round_trip(llada_dir, files[qtype], qtype)


@pytest.mark.parametrize("qtype", FALLBACKS)
def test_files_decode_as_the_round_tripped_weights(llada_dir, files, qtype, tmp_path, one_thread):
    lm = loading.load(resolve_model_dir(str(files[qtype])), dtype="fp64")
    twin = loading.load(round_tripped(llada_dir, tmp_path / f"{qtype}-round-trip", qtype), dtype="fp64")
    assert decode(lm) == decode(twin)
    assert any(qtype in n and "dequantized" in n for n in lm.notes)


def held(lin, qtype: str, deq: torch.Tensor, kernel: str) -> None:
    """`lin` holds exactly fastdllm's `kernel` quantization of the package's dequantization `deq`."""
    if kernel == "int4":
        assert type(lin) is Int4Linear, qtype
        assert torch.equal(lin.dequantized(), dequantize_int4(*quantize_int4(deq))), qtype
    else:
        assert type(lin) is Int8Linear, qtype
        q, scale = quantize_int8(deq, torch.bfloat16)
        assert torch.equal(lin.weight, q) and torch.equal(lin.scales, scale), qtype


def kept_linears(lm, src, name_of_type):
    """(linear, GGUF type, the package's dequantization) of every block linear, published row order."""
    config = json.loads((src / "config.json").read_text())
    for i, block in enumerate(lm.model.model.transformer.blocks):
        for name in LINEARS:
            qtype = name_of_type(f"blk.{i}.{GGUF_LINEAR[name]}.weight")
            heads = {"q_proj": config["n_heads"], "k_proj": config["n_kv_heads"]}.get(name)
            yield getattr(block, name), qtype, packages_dequantization(src, f"model.transformer.blocks.{i}.{name}.weight",
                                                                      qtype, heads)


def test_small_q4_k_m_keeps_q4_k_as_int4_and_the_fallbacks_as_int8_rows(narrow, files):
    """The default on a CPU (bf16): int4 for Q4_K, int8 rows for Q5_0, Q5_1 and Q8_0 (the stand-in
    for Q6_K in a 4-bit file) as for Q6_K; the embedding (Q5_0) and head (Q8_0) into int8 rows."""
    lm = loading.load(resolve_model_dir(str(files["Q4_K_M"])), dtype="bf16")
    assert lm.quantize == "int4"
    kinds = set()
    for lin, qtype, deq in kept_linears(lm, narrow, small_q4_k_m):
        held(lin, qtype, deq, "int4" if qtype == "Q4_K" else "int8")
        kinds.add(qtype)
    assert kinds == {"Q4_K", "Q5_0", "Q5_1", "Q6_K", "Q8_0"}
    text = lm.info["gguf_int4"]
    assert text.startswith("14 block linears: ") and "from Q4_K into int4" in text and "from Q5_1 into int8 rows" in text
    from fastdllm.models.cpu_kernels import int8_products
    head = "the embedding (Q5_0) and head (Q8_0)" if int8_products() else "the embedding (Q5_0)"   # the head where W8A8 runs
    assert f"{head} into int8 rows from the file" in text


def test_quantize_int8_takes_every_fallback_into_int8_rows(narrow, files):
    lm = loading.load(resolve_model_dir(str(files["Q4_K_M"])), dtype="bf16", quantize="int8")
    for lin, qtype, deq in kept_linears(lm, narrow, small_q4_k_m):
        held(lin, qtype, deq, "int8")


@pytest.mark.parametrize("qtype, kernel", [("Q4_1", "int4"), ("Q5_0", "int8"), ("Q5_1", "int8")])
def test_uniform_fallback_files_under_quantize_int4(llada_dir, files, qtype, kernel):
    """Q4_1 is a 4-bit type (int4, and int4 by default in bf16); Q5_0 / Q5_1 go to int8 rows."""
    lm = loading.load(resolve_model_dir(str(files[qtype])), dtype="bf16", quantize="int4")
    for lin, t, deq in kept_linears(lm, llada_dir, lambda name: qtype):
        held(lin, t, deq, kernel)
    default = loading.load(resolve_model_dir(str(files[qtype])), dtype="bf16")
    assert default.quantize == ("int4" if qtype == "Q4_1" else "none")


def test_q8_0_is_int4_alone_and_int8_rows_beside_4_bit_types():
    from fastdllm.checkpoints.gguf_file import GGUFTensor
    from fastdllm.checkpoints.gguf_int4 import kernels_for

    t = GGUFTensor("model.transformer.blocks.0.q_proj.weight", "blk.0.attn_q.weight", "Q8_0", (64, 64), 0, None)
    assert kernels_for("int4", ["Q8_0", "F32"])(t) == "int4"             # a Q8_0 file asked to be int4
    assert kernels_for("int4", ["Q5_0", "Q8_0", "Q4_K", "F32"])(t) == "int8"   # a Q4_K_M file: Q6_K's stand-in
    assert kernels_for("int8", ["Q8_0"])(t) == "int8" and kernels_for("none", ["Q8_0"]) is None


def test_cli_generate_and_info_on_a_small_q4_k_m_file(files):
    r = invoke("generate", "-m", files["Q4_K_M"], *SMALL, "--json", "Hello there")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["ids"] and "kept quantized: loaded as --quantize int4" in r.stderr
    info = json.loads(invoke("info", "-m", files["Q4_K_M"], "--json").stdout)
    assert "Q4_K kept as int4 and Q5_0, " in info["dtype_on_disk"] and "Q5_1" in info["dtype_on_disk"]


# --- the other families: a 4-bit file of a tiny model is Q4_0, or Q5_0 where Q4_K_M falls back ---

@pytest.fixture(scope="module")
def family_dirs(dream_dir, tiny):
    return {"dream": dream_dir, "rnd1": tiny("rnd1", dtype=torch.float32),
            "llada-moe": tiny("llada_moe", dtype=torch.float32)}


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0"])
@pytest.mark.parametrize("arch", ["dream", "rnd1", "llada-moe"])
def test_other_families_decode_as_the_round_tripped_weights(family_dirs, arch, qtype, tmp_path, one_thread):
    """fp64, dequantized: the same tokens and NFE as the folder of the package's quantize -> dequantize
    (the MoE routers stay F32, as the converter keeps them). Every matrix of these tiny models has rows
    under 256, so llama-quantize's Q4_K_M of them is Q5_0 (and Q8_0) throughout."""
    from gguf_writer import write_llada_moe_gguf, write_qwen_gguf

    src = family_dirs[arch]
    out = tmp_path / f"tiny-{arch}-{qtype}.gguf"
    path = write_llada_moe_gguf(src, out, qtype) if arch == "llada-moe" else write_qwen_gguf(src, out, arch, qtype)
    lm = loading.load(resolve_model_dir(str(path)), dtype="fp64")
    twin = loading.load(round_tripped(src, tmp_path / "twin", qtype, keep=("mlp.gate.weight",)), dtype="fp64")
    assert decode_qwen(lm) == decode_qwen(twin)
