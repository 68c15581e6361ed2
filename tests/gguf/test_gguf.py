"""GGUF files (checkpoints/gguf_file.py, gguf_folder.py): the tiny LLaDA checkpoint written as
llama.cpp's converter writes it (metadata keys, tensor names, q/k rows permuted, F32 / BF16 / Q8_0 as
its --outtype picks them), then decoded by fastdllm: the same tokens and NFE as the safetensors
folder in float64, Q8_0 as the gguf package's own quantize -> dequantize of the same weights."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import SMALL

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir

from gguf_decode import CFG, PROMPTS, decode
from one_line import one_line_refusal

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from gguf_writer import assert_read_as_round_trip, extra, folder_weights, round_tripped, write_gguf  # noqa: E402  (after the skip)

pytestmark = pytest.mark.fast


# --- fixtures ---

@pytest.fixture(scope="module")
def files(llada_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {t: write_gguf(llada_dir, root / f"tiny-llada-{t}.gguf", t) for t in ("F32", "BF16", "Q8_0")}


# --- exactness ---

@pytest.mark.parametrize("outtype", ["F32", "BF16"])
def test_float_gguf_decodes_as_the_folder(llada_dir, llada64, files, outtype, one_thread):
    lm = loading.load(resolve_model_dir(str(files[outtype])), dtype="fp64")
    assert lm.specials == llada64.specials
    for p in PROMPTS:        # the rebuilt tokenizer and chat template give the same ids
        assert lm.encode(p, chat=True) == llada64.encode(p, chat=True)
        assert lm.encode(p, chat=False) == llada64.encode(p, chat=False)
    text = "  Café: x = 12345;\n\tdef f(): return 'ok'  # ünïcode <|endoftext|>"
    assert lm.encode(text, chat=False) == llada64.encode(text, chat=False)
    assert lm.detokenize(lm.encode(text, chat=False)) == llada64.detokenize(llada64.encode(text, chat=False))
    got, want = decode(lm), decode(llada64)
    assert got == want                               # tokens and NFE, exactly
    assert len({tuple(c) for c, _ in want}) == len(PROMPTS) and any(n < CFG.gen_len for _, n in want)


@pytest.mark.parametrize("outtype, dtype", [("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16)])
def test_unpermuted_weights_equal_the_folder(llada_dir, files, tmp_path, outtype, dtype):
    from fastdllm.checkpoints.gguf_file import state_dict

    path = files.get(outtype) or write_gguf(llada_dir, tmp_path / f"{outtype}.gguf", outtype)
    config = json.loads((resolve_model_dir(str(path)) / "config.json").read_text())
    got = state_dict(path, config, torch.float64)
    want = folder_weights(llada_dir)
    assert got.keys() == want.keys()
    for name, tensor in want.items():        # norms stay F32 in every file (the converter's rule)
        assert torch.equal(got[name], tensor.to(dtype if tensor.ndim == 2 else torch.float32).double()), name


def test_q8_0_decodes_as_the_round_tripped_weights(llada_dir, files, tmp_path, one_thread):
    lm = loading.load(resolve_model_dir(str(files["Q8_0"])), dtype="fp64")
    twin = loading.load(round_tripped(llada_dir, tmp_path / "q8-round-trip", "Q8_0"), dtype="fp64")
    assert decode(lm) == decode(twin)
    assert any("Q8_0" in n and "dequantized" in n for n in lm.notes)


def test_q8_0_weights_are_the_packages_round_trip(llada_dir, files):
    assert_read_as_round_trip(llada_dir, files["Q8_0"], "Q8_0")


# --- refusals: one line each, before any weight is read ---

@pytest.fixture
def no_weights_read(monkeypatch):
    """Loading must not get as far as the tensors."""
    from fastdllm.checkpoints import gguf_file

    def refuse(*a, **k):
        raise AssertionError("weights read before the refusal")
    monkeypatch.setattr(gguf_file, "state_dict", refuse)
    monkeypatch.setattr(loading, "gguf_state_dict", refuse)


@pytest.mark.parametrize("arch, message", [("llama", "'llama' is not a diffusion architecture fastdllm reads "
                                                    "(it reads: llada, dream, rnd1, llada-moe)")])
def test_other_architectures_are_refused_by_name(llada_dir, tmp_path, arch, message, no_weights_read):
    path = write_gguf(llada_dir, tmp_path / f"{arch}.gguf", arch=arch)
    one_line_refusal(lambda: resolve_model_dir(str(path)), message)


def test_other_tensor_types_are_refused_by_name(llada_dir, tmp_path, no_weights_read):
    mx = write_gguf(llada_dir, tmp_path / "mxfp4.gguf", "MXFP4")          # a 32-value type fastdllm does not read
    one_line_refusal(lambda: resolve_model_dir(str(mx)), "mxfp4.gguf holds MXFP4 tensors (e.g. ")
    one_line_refusal(lambda: resolve_model_dir(str(mx)), "; fastdllm reads GGUF tensors of types F32, F16, BF16, "
                                                         "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K so far")
    for qtype in ("Q2_K", "IQ2_XXS"):
        k_quant = write_gguf(llada_dir, tmp_path / f"{qtype}.gguf", "Q8_0", extra_tensor=("blk.0.extra.weight", qtype))
        one_line_refusal(lambda: resolve_model_dir(str(k_quant)), f"holds {qtype} tensors (e.g. blk.0.extra.weight)")


def test_tensors_llada_has_no_place_for_are_refused(llada_dir, tmp_path, no_weights_read):
    path = write_gguf(llada_dir, tmp_path / "bias.gguf", extra_tensor=("blk.0.attn_output.bias", "F32"))
    one_line_refusal(lambda: resolve_model_dir(str(path)), "tensor blk.0.attn_output.bias has no place in fastdllm's llada")


@pytest.mark.parametrize("key, message", [("tokenizer.ggml.mask_token_id", "declares no mask token (tokenizer.ggml.mask_token_id)"),
                                          ("block_count", "lacks the GGUF key llada.block_count, which decoding needs"),
                                          ("context_length", "lacks the GGUF key llada.context_length"),
                                          ("tokenizer.ggml.tokens", "lacks the GGUF key tokenizer.ggml.tokens")])
def test_missing_keys_decoding_needs_are_refused(llada_dir, tmp_path, key, message, no_weights_read):
    path = write_gguf(llada_dir, tmp_path / "missing.gguf", skip_keys=(key,))
    one_line_refusal(lambda: resolve_model_dir(str(path)), message)


def test_split_files_are_refused(llada_dir, tmp_path, no_weights_read):
    path = write_gguf(llada_dir, tmp_path / "x-00001-of-00002.gguf", hook=lambda w: w.add_uint16("split.count", 2))
    one_line_refusal(lambda: resolve_model_dir(str(path)), "is one of 2 parts of a split GGUF file")


def test_bad_files_are_one_line(files, tmp_path, no_weights_read):
    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights\n" * 10)
    one_line_refusal(lambda: resolve_model_dir(str(text)), "notes.gguf is not a GGUF file (it does not start with the bytes GGUF)")
    data = files["F32"].read_bytes()
    for cut in (len(data) - 10, len(data) // 2, 100):      # in the tensor data, in the metadata
        short = tmp_path / f"cut-{cut}.gguf"
        short.write_bytes(data[:cut])
        one_line_refusal(lambda: resolve_model_dir(str(short)), f"cut-{cut}.gguf is truncated or damaged")
    short.write_bytes(data[:3])
    one_line_refusal(lambda: resolve_model_dir(str(short)), "is not a GGUF file")
    one_line_refusal(lambda: resolve_model_dir(str(tmp_path / "absent.gguf")), "GGUF file not found")


def test_without_the_gguf_package_one_line_names_the_extra(files, monkeypatch):
    import sys

    other = files["F32"].with_name("unseen.gguf")        # no folder made for it yet
    other.write_bytes(files["F32"].read_bytes())
    monkeypatch.setitem(sys.modules, "gguf", None)        # import gguf -> ImportError
    one_line_refusal(lambda: resolve_model_dir(str(other)), "reading GGUF files needs the gguf package: "
                                                            "pip install 'fastdllm[gguf]'")


# --- the CLI: `-m FILE.gguf` as a folder is taken ---

def test_cli_info_on_a_gguf_file(llada_dir, files):
    from cli_runner import invoke

    r = invoke("info", "-m", files["Q8_0"], "--json")
    assert r.exit_code == 0, r.stderr
    got, want = json.loads(r.stdout), json.loads(invoke("info", "-m", llada_dir, "--json").stdout)
    assert got["path"] == str(files["Q8_0"].resolve()) and got["family"] == "llada"
    assert got["dtype_on_disk"].startswith("q8_0, f32 (GGUF; Q8_0 dequantized to the compute dtype at load")
    for key in ("parameters", "layers", "hidden_size", "context_length", "vocab_size", "mask_id", "eos_ids",
                "end_of_turn_id", "chat_template", "memory"):
        assert got[key] == want[key], key


def test_cli_generate_on_a_gguf_file_gives_the_folders_answer(llada_dir, files):
    from cli_runner import invoke

    args = ["generate", *SMALL, "--dtype", "fp32", "--threshold", "0.7", "--json", "Hello there"]
    got = invoke(*args[:1], "-m", files["F32"], *args[1:])
    assert got.exit_code == 0, got.stderr
    want = json.loads(invoke(*args[:1], "-m", llada_dir, *args[1:]).stdout)
    got = json.loads(got.stdout)
    assert (got["ids"], got["nfe"], got["text"]) == (want["ids"], want["nfe"], want["text"])
    assert got["model"]["family"] == "llada"


def test_cli_refusal_is_one_line_exit_1(llada_dir, tmp_path):
    from cli_runner import invoke

    path = write_gguf(llada_dir, tmp_path / "mxfp4.gguf", "MXFP4")
    r = invoke("generate", "-m", path, "-n", "8", "Hello")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "holds MXFP4 tensors" in r.stderr
