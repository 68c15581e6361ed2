#!/usr/bin/env python3
"""A random LLaDA checkpoint as GGUF files made by llama.cpp's own tools, for the closing note of issue
53 and vs_llamacpp.py --gguf: convert_hf_to_gguf.py to F32, then llama-quantize (its default tensor
choices) to Q8_0, Q4_0 and Q4_K_M. Where rows are not a multiple of 256, llama-quantize's Q4_K_M
falls back to Q5_0 / Q5_1 / Q8_0 for them (llama-quant.cpp's tensor_type_fallback).

    python benchmarks/llamacpp_llada_files.py [--d-model 256 --layers 4 --mlp 704]

Needs the build and converter that llamacpp_build.py leaves in its cache (it does not build: a
missing llama-quantize is said in one line). The checkpoint is fastdllm's tiny LLaDA writer
(fastdllm/testing/tiny_random.py: LLaDA-8B-Instruct's config keys and tensor names, a small
byte-level BPE trained here), bf16 on disk. Its BPE has no pre-tokenizer hash the converter knows, so
the converter's lookup alone is answered "gpt-2" (as tests/gguf/test_gguf_converter.py does); every
other line of the conversion is the converter's. Files land in CACHE/gguf/llada-<shape>-<type>.gguf.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import llamacpp_build as lb

KINDS = ("q8_0", "q4_0", "q4_k_m")
CONVERT = """import runpy, sys
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def llada_files(d_model: int, layers: int, heads: int, mlp: int) -> dict[str, Path]:
    from fastdllm.testing.tiny_random import write_llada

    src = next(iter(sorted(lb.CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))), None)
    quantize = lb.CACHE / "build" / "bin" / "llama-quantize"
    if src is None or not quantize.exists():
        raise SystemExit(f"no llama.cpp build in {lb.CACHE}: run benchmarks/llamacpp_build.py first")
    shape = f"d{d_model}-l{layers}-mlp{mlp}"
    ckpt = lb.CACHE / "checkpoints" / f"llada-{shape}"
    if not (ckpt / "config.json").exists():
        write_llada(ckpt, d_model=d_model, n_layers=layers, n_heads=heads, mlp_hidden_size=mlp)
    out = {"f32": lb.CACHE / "gguf" / f"llada-{shape}-f32.gguf"}
    out["f32"].parent.mkdir(parents=True, exist_ok=True)
    if not out["f32"].exists():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [src, src / "gguf-py", lb.converter_deps()])))
        with open(out["f32"].with_suffix(".log"), "w") as log:
            lb.run([sys.executable, "-c", CONVERT, src / "convert_hf_to_gguf.py", ckpt, "--outtype", "f32",
                    "--outfile", out["f32"]], env=env, stdout=log, stderr=subprocess.STDOUT)
    for kind in KINDS:
        out[kind] = out["f32"].with_name(f"llada-{shape}-{kind}.gguf")
        if not out[kind].exists():
            with open(out[kind].with_suffix(".log"), "w") as log:
                lb.run([quantize, out["f32"], out[kind], kind.upper(), os.cpu_count()], stdout=log,
                       stderr=subprocess.STDOUT)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=704)
    a = ap.parse_args()
    for kind, path in llada_files(a.d_model, a.layers, a.heads, a.mlp).items():
        print(f"{kind:7s} {path}  {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
