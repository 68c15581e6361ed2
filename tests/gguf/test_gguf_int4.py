"""The 4-bit GGUF types kept quantized (checkpoints/gguf_int4.py, gguf_int8.py; docs/specs/gguf.md 11): Q4_0
and Q4_K into fastdllm's int4 kernels, Q6_K / Q5_K into int8 rows, each the fastdllm quantization of
the gguf package's own dequantization; exact where the file's values lie on fastdllm's int4 grid;
int4 by default for a 4-bit file on a CPU. The k-quant blocks come from checkpoints/gguf_kquants.py,
checked here against the package's dequantization."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import invoke
from helpers import SMALL

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.testing.tiny_random import write_llada
from fastdllm.models.cpu_int4 import Int4Linear, dequantize_int4, quantize_int4
from fastdllm.models.cpu_quant import Int8Linear, quantize_int8

from conftest import VARIED
from gguf_decode import CFG
from gguf_writer import LINEARS, folder_weights, packages_dequantization, write_gguf

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.fast


def q4_k_m(name: str) -> str:
    """llama-quantize's Q4_K_M in small: Q6_K for the head and some attn_v / ffn_down, Q5_K for one, Q4_K else."""
    if name == "output.weight" or name in ("blk.0.attn_v.weight", "blk.0.ffn_down.weight"):
        return "Q6_K"
    return "Q5_K" if name == "blk.1.ffn_down.weight" else "Q4_K"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The tiny LLaDA with rows of 256 (one k-quant super-block)."""
    return write_llada(tmp_path_factory.mktemp("ckpt") / "tiny-llada-256", d_model=256, mlp_hidden_size=256, **VARIED)


@pytest.fixture(scope="module")
def files(wide, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf4")
    return {"Q4_0": write_gguf(wide, root / "tiny-llada-Q4_0.gguf", "Q4_0"),
            "Q4_K_M": write_gguf(wide, root / "tiny-llada-Q4_K_M.gguf", q4_k_m)}


# --- the k-quant writer against the package's reader ---

@pytest.mark.parametrize("qtype, top, signed", [("Q4_K", 15, False), ("Q5_K", 31, False), ("Q6_K", 31, True)])
def test_k_quant_writer_round_trips_values_on_the_grid(qtype, top, signed):
    """Values that are exactly d * sc_j * q - dmin * m_j (every code and the largest scales present):
    the package's dequantization of the writer's blocks gives them back bit for bit, so every field
    (scales, mins, nibbles, fifth / sixth bits) sits where the package reads it."""
    from fastdllm.checkpoints.gguf_kquants import quantize_kquant

    g = np.random.default_rng(0)
    n, per = (4, 16) if signed else (4, 8)                     # super-blocks, sub-blocks each
    size = 256 // per
    d, dmin = np.float32(2.0 ** -12), np.float32(2.0 ** -10)
    if signed:       # Q6_K: w = d * sc_j * (q - 32), sc_j int8 with |sc| = 127 somewhere, code -32 in each sub-block
        sc = g.integers(1, 128, (n, per)) * g.choice([-1, 1], (n, per))
        sc[:, 0] = 127
        q = g.integers(-32, 32, (n, per, size))
        q[..., 0] = -32
        x = d * sc[..., None] * q
    else:            # w = d * sc_j * q - dmin * m_j, q in [0, top] with both ends present, sc_j / m_j 6-bit
        sc, m = g.integers(1, 64, (n, per)), g.integers(1, 64, (n, per))
        sc[:, 0] = m[:, 0] = 63
        q = g.integers(0, top + 1, (n, per, size))
        q[..., 0], q[..., 1] = 0, top
        x = d * sc[..., None] * q - dmin * m[..., None]
    x = x.astype(np.float32).reshape(n, 256)
    raw = quantize_kquant(x, qtype)
    assert raw.shape == (n, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][1])
    assert np.array_equal(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]), x)


@pytest.mark.parametrize("qtype, bound", [("Q4_K", 0.09), ("Q5_K", 0.045), ("Q6_K", 0.022)])
def test_k_quant_writer_error_on_normal_weights(qtype, bound):
    from fastdllm.checkpoints.gguf_kquants import quantize_kquant

    x = (np.random.default_rng(1).standard_normal((64, 512)) * 0.02).astype(np.float32)
    y = gguf.quants.dequantize(quantize_kquant(x, qtype), gguf.GGMLQuantizationType[qtype])
    assert np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()) < bound


# --- what the kept linears hold ---

@pytest.mark.parametrize("file", ["Q4_0", "Q4_K_M"])
def test_kept_linears_are_fastdllms_quantization_of_the_packages_dequantization(wide, files, file):
    lm = loading.load(resolve_model_dir(str(files[file])), dtype="bf16", quantize="int4")
    config = json.loads((wide / "config.json").read_text())
    kinds = set()
    for i, block in enumerate(lm.model.model.transformer.blocks):
        for name in LINEARS:
            gguf_name = f"blk.{i}." + {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "attn_out": "attn_output",
                                       "ff_proj": "ffn_gate", "up_proj": "ffn_up", "ff_out": "ffn_down"}[name]
            qtype = "Q4_0" if file == "Q4_0" else q4_k_m(gguf_name + ".weight")
            heads = {"q_proj": config["n_heads"], "k_proj": config["n_kv_heads"]}.get(name)
            deq = packages_dequantization(wide, f"model.transformer.blocks.{i}.{name}.weight", qtype, heads)
            lin = getattr(block, name)
            if qtype in ("Q4_0", "Q4_K"):
                assert type(lin) is Int4Linear, name
                want = dequantize_int4(*quantize_int4(deq))
            else:                                           # Q6_K, Q5_K: int8 rows
                assert type(lin) is Int8Linear, name
                q, scale = quantize_int8(deq, torch.bfloat16)
                assert torch.equal(lin.weight, q) and torch.equal(lin.scales, scale), name
                want = q.float() * scale.float()[:, None]
            assert torch.equal(lin.dequantized(), want), name
            kinds.add(qtype)
    assert kinds == ({"Q4_0"} if file == "Q4_0" else {"Q4_K", "Q5_K", "Q6_K"})
    assert lm.info["gguf_int4"].startswith("14 block linears")


def test_q4_0_on_fastdllms_int4_grid_is_held_exactly(wide, tmp_path):
    """Q4_0 blocks whose fp16 scales are m * 2^e (m a 4-bit integer, one e per row, some |m| >= 8) and
    which hold code 0: fastdllm's int4 holds them bit for bit (the groups, codes and the extreme's
    code agree; only free scales do not). The loaded model then equals the folder of those weights
    under --quantize int4."""
    import shutil

    from safetensors.torch import load_file, save_file

    grid = shutil.copytree(wide, tmp_path / "grid")
    g = torch.Generator().manual_seed(0)
    for shard in sorted(grid.glob("*.safetensors")):
        weights = load_file(shard)
        for name, w in weights.items():
            if w.ndim == 2:                          # the embedding and head too: the file holds them as Q4_0
                N, K = w.shape
                m = torch.randint(1, 16, (N, K // 32), generator=g) * (torch.randint(0, 2, (N, K // 32), generator=g) * 2 - 1)
                m[:, 0] = 15
                codes = torch.randint(0, 16, (N, K), generator=g)
                codes[:, ::32] = 0                                  # the extreme: code 0 (-8) in every block
                row = torch.exp2(torch.randint(-12, -9, (N, 1), generator=g).float())
                weights[name] = ((codes.view(N, -1, 32) - 8) * (m * row)[..., None]).view(N, K).float()
        save_file(weights, shard, metadata={"format": "pt"})
    path = write_gguf(grid, tmp_path / "grid-Q4_0.gguf", "Q4_0")
    lm = loading.load(resolve_model_dir(str(path)), dtype="fp32", quantize="int4")
    want = folder_weights(grid)
    for i, block in enumerate(lm.model.model.transformer.blocks):
        for name in LINEARS:
            assert torch.equal(getattr(block, name).dequantized(), want[f"model.transformer.blocks.{i}.{name}.weight"].float())
    twin = loading.load(grid, dtype="fp32", quantize="int4")
    ids = torch.tensor([lm.encode("What is 2 + 2?", chat=True) + [lm.specials.mask] * 8])
    with torch.no_grad():
        assert torch.allclose(lm.model(ids).logits, twin.model(ids).logits, rtol=0, atol=1e-5)


def test_q4_0_file_decodes_as_fastdllms_int4_of_the_round_tripped_folder(wide, files, tmp_path, one_thread):
    """fp32 compute: the same int4 weights, the same int8 embedding and head, as the folder of the
    package's quantize -> dequantize under --quantize int4; the same tokens and NFE."""
    from fastdllm.decode.engine import run

    from gguf_writer import round_tripped

    lm = loading.load(resolve_model_dir(str(files["Q4_0"])), dtype="fp32", quantize="int4")
    twin = loading.load(round_tripped(wide, tmp_path / "rt", "Q4_0"), dtype="fp32", quantize="int4")
    ids = torch.tensor([lm.encode("What is 2 + 2?", chat=True) + [lm.specials.mask] * 8])
    with torch.no_grad():
        got, want = lm.model(ids).logits, twin.model(ids).logits
    assert torch.allclose(got, want, rtol=0, atol=1e-4), float((got - want).abs().max())
    prompts = [lm.encode(p, chat=True) for p in ("Hi.", "What is 2 + 2?")]
    assert [run(lm.decoder, [p], CFG).canvas[0].tolist() for p in prompts] == \
        [run(twin.decoder, [p], CFG).canvas[0].tolist() for p in prompts]


@pytest.mark.parametrize("file", ["Q4_0", "Q4_K_M"])
def test_logit_error_against_the_dequantized_model(files, file, wide, tmp_path):
    """bf16 int4 from the file against the fp32 model of the package's dequantization, beside the
    folder route (the round-tripped weights in bf16, then --quantize int4): as close (within 10%)."""
    lm = loading.load(resolve_model_dir(str(files[file])), dtype="bf16")          # the default: int4
    ref = loading.load(resolve_model_dir(str(files[file])), dtype="fp32")         # dequantized
    assert lm.quantize == "int4" and ref.quantize == "none"
    ids = torch.tensor([lm.encode("What is 2 + 2?", chat=True) + [lm.specials.mask] * 8])
    own = loading.load(wide, dtype="bf16", quantize="int4")                       # fastdllm's int4 of the originals
    orig = loading.load(wide, dtype="fp32")
    with torch.no_grad():
        want, got = ref.model(ids).logits, lm.model(ids).logits.float()
        base, own_got = orig.model(ids).logits, own.model(ids).logits.float()
    err = float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())
    own_err = float((own_got - base).pow(2).mean().sqrt() / base.pow(2).mean().sqrt())
    print(f"{file}: relative rms logit error, int4 from the file vs its fp32 dequantization {err:.3f}; "
          f"fastdllm's int4 of the original weights vs them {own_err:.3f}")
    assert err < 1.5 * own_err + 0.05


# --- memory, chunks, the default, the CLI ---

def test_stand_ins_hold_no_memory_and_chunks_change_nothing(files, wide, monkeypatch):
    from fastdllm.checkpoints import gguf_file, gguf_int8
    from fastdllm.checkpoints.gguf_int4 import int4_kernels

    config = json.loads((resolve_model_dir(str(files["Q4_K_M"])) / "config.json").read_text())
    weights, codes = gguf_int8.state_dict_kept(files["Q4_K_M"], config, torch.bfloat16, int4_kernels)
    assert len([n for n in codes if ".blocks." in n]) == 14        # and the embedding / head: int8 rows
    for name in codes:
        assert weights[name].untyped_storage().nbytes() <= 2 and weights[name].stride() == (0, 0), name
    monkeypatch.setattr(gguf_file, "CHUNK", 256 * 3)                  # 3 rows at a time
    _, small = gguf_int8.state_dict_kept(files["Q4_K_M"], config, torch.bfloat16, int4_kernels)
    for name, (kernel, qtype, held) in codes.items():
        other = small[name][2]
        pairs = zip(held.values(), other.values()) if kernel == "int4" else zip(held, other)
        assert all(torch.equal(a, b) for a, b in pairs), name


def test_default_is_int4_on_a_cpu_in_bf16_only(files, monkeypatch):
    from fastdllm.checkpoints.gguf_int4 import default_quantize

    source = {"types": ["Q4_K", "Q6_K", "F32"]}
    assert default_quantize(source, "none", "cpu", "auto")[0] == "int4"
    assert default_quantize(source, "none", "cpu", "fp32") == ("none", None)       # asked for floats
    assert default_quantize(source, "int8", "cpu", "auto") == ("int8", None)
    assert default_quantize(source, "none", "cuda", "auto") == ("none", None)      # a GPU: dequantized to bf16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_quantize(source, "none", "auto", "auto") == ("none", None)
    assert default_quantize({"types": ["Q8_0"]}, "none", "cpu", "auto") == ("none", None)
    lm = loading.load(resolve_model_dir(str(files["Q4_0"])), dtype="fp32")
    assert lm.quantize == "none" and any("dequantized to float32" in n and "--quantize int4" in n for n in lm.notes)


def test_int4_on_a_gpu_is_one_line():
    from fastdllm.checkpoints.placement import cpu_quant_check
    from fastdllm.errors import UserError

    with pytest.raises(UserError, match="--quantize int4 has CPU kernels only"):
        cpu_quant_check("int4", "auto", {"": "cuda:0"})


def test_cli_generate_and_info_on_a_q4_k_m_file(files):

    r = invoke("generate", "-m", files["Q4_K_M"], *SMALL, "--json", "Hello there")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ids"] and out["model"]["family"] == "llada"
    assert "kept quantized: loaded as --quantize int4" in r.stderr
    info = json.loads(invoke("info", "-m", files["Q4_K_M"], "--json").stdout)
    assert info["dtype_on_disk"].startswith("q4_k, q6_k, q5_k, f32 (GGUF; on a CPU Q4_K kept as int4 and Q6_K, Q5_K as int8")


def test_dream_q4_0_keeps_int4(dream_dir, tmp_path):
    from gguf_writer import write_qwen_gguf

    path = write_qwen_gguf(dream_dir, tmp_path / "tiny-dream-Q4_0.gguf", "dream", "Q4_0")
    lm = loading.load(resolve_model_dir(str(path)))
    ref = loading.load(resolve_model_dir(str(path)), dtype="fp32")
    assert lm.info["gguf_int4"].startswith("14 block linears: 14 from Q4_0 into int4")
    ids = torch.tensor([lm.encode("Hi there", chat=False) + [lm.specials.mask] * 4])
    with torch.no_grad():
        got, want = lm.model(ids).logits.float(), ref.model(ids).logits
    assert float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()) < 0.3
