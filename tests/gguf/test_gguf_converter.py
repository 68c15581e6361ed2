"""GGUF files made by llama.cpp's own convert_hf_to_gguf.py, not by tests/gguf/gguf_writer.py: each
family's tiny checkpoint in its published layout, converted to F32 (fastdllm on the file commits the
same tokens with the same NFE as on the folder, float64) and to Q8_0 (the same tokens as fastdllm on
the folder's weights put through the gguf package's Q8_0 round trip).

The converter ships in the llama-cpp-python sdist (vendor/llama.cpp); benchmarks/llamacpp_build.py
downloads it into ~/.cache/fastdllm-vs-llamacpp/ (or $FASTDLLM_VS_LLAMACPP) with the sentencepiece
the converter imports. Where that folder is absent (CI: no download of the sdist there) the tests
are skipped by name; tests/gguf/test_gguf*.py check the same readers on the writer's files everywhere.

    python benchmarks/llamacpp_build.py && pytest tests/gguf/test_gguf_converter.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run

gguf = pytest.importorskip("gguf")
from gguf_writer import round_tripped  # noqa: E402  (after the skip)

CACHE = Path(os.environ.get("FASTDLLM_VS_LLAMACPP") or Path.home() / ".cache" / "fastdllm-vs-llamacpp")
SOURCE = next(iter(sorted(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))), None)
DEPS = CACHE / "pydeps"
pytestmark = pytest.mark.skipif(SOURCE is None or not (DEPS / "sentencepiece").exists(),
                                reason=f"llama.cpp's converter is not in {CACHE} (benchmarks/llamacpp_build.py)")

CFG = DecodeConfig(gen_len=24, block_len=8, cache="dual", rule="threshold", threshold=0.7, early_stop=False)
PROMPTS = ["Hi.", "What is 2 + 2?"]


# The converter names a BPE vocabulary's pre-tokenizer by hashing how it splits a fixed text, and
# refuses one it has no hash for: the tiny LLaDA and LLaDA-MoE checkpoints carry a small BPE trained
# here (their real tokenizer.json files are not among the published fixtures), so for them the
# lookup alone answers "gpt-2", as tests/gguf/gguf_writer.py writes; every other line is the converter's.
PRE = {"llada": "gpt-2", "llada-moe": "gpt-2"}
CONVERT = """import runpy, sys
if {pre!r} is not None:
    import conversion.base
    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converted(folder: Path, outtype: str, out: Path, family: str) -> Path:
    """`folder` through convert_hf_to_gguf.py --outtype (f32, q8_0); its log in the error if it fails."""
    view = out.with_suffix(".view")                          # Dream: Qwen2's tokenizer class, as the converter reads it
    view.mkdir()
    for f in folder.iterdir():
        (view / f.name).symlink_to(f.resolve())
    if (folder / "tokenizer_config.json").read_text().count("DreamTokenizer"):
        import json

        (view / "tokenizer_config.json").unlink()
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg.pop("auto_map", None)
        (view / "tokenizer_config.json").write_text(json.dumps(dict(cfg, tokenizer_class="Qwen2Tokenizer")))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SOURCE), str(SOURCE / "gguf-py"), str(DEPS)]))
    args = [str(SOURCE / "convert_hf_to_gguf.py"), str(view), "--outtype", outtype, "--outfile", str(out)]
    done = subprocess.run([sys.executable, "-c", CONVERT.format(pre=PRE.get(family)), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def decode(lm) -> list:
    chat = lm.has_chat_template
    return [(r.canvas[0].tolist(), r.nfe) for r in (run(lm.decoder, [lm.encode(p, chat=chat)], CFG) for p in PROMPTS)]


@pytest.fixture(scope="module")
def folders(llada_dir, dream_dir, tiny):
    return {"llada": llada_dir, "dream": dream_dir,
            "llada-moe": tiny("llada_moe", dtype=torch.float32),
            "rnd1": tiny("rnd1", dtype=torch.float32)}


@pytest.mark.parametrize("family", ["llada", "dream", "llada-moe", "rnd1"])
def test_the_converters_f32_file_decodes_as_the_folder(folders, family, tmp_path, one_thread):
    file = converted(folders[family], "f32", tmp_path / f"{family}-f32.gguf", family)
    lm = loading.load(resolve_model_dir(str(file)), dtype="fp64")
    folder = loading.load(folders[family], dtype="fp64")
    assert lm.specials == folder.specials
    for p in PROMPTS:
        assert lm.encode(p, chat=lm.has_chat_template) == folder.encode(p, chat=folder.has_chat_template)
    got, want = decode(lm), decode(folder)
    assert got == want                                   # tokens and NFE, exactly
    assert len({tuple(c) for c, _ in want}) == len(PROMPTS)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_converters_q8_0_file_decodes_as_the_round_tripped_weights(folders, family, tmp_path, one_thread):
    file = converted(folders[family], "q8_0", tmp_path / f"{family}-q8_0.gguf", family)
    reader = gguf.GGUFReader(file)               # every matrix Q8_0 (the round trip quantizes each 2-D weight)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.Q8_0 for t in reader.tensors if len(t.shape) == 2)
    lm = loading.load(resolve_model_dir(str(file)), dtype="fp64")
    twin = loading.load(round_tripped(folders[family], tmp_path / "round-trip", "Q8_0"), dtype="fp64")
    assert decode(lm) == decode(twin)
