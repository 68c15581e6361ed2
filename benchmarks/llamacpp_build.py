#!/usr/bin/env python3
"""llama.cpp's diffusion CLI for benchmarks/vs_llamacpp.py: download, build, checkpoints, conversion.

    python benchmarks/llamacpp_build.py                 # build only (prints what it built)
    python benchmarks/llamacpp_build.py --shape 22m     # and that shape's GGUFs (f32, bf16, q8_0, q4_0)

Everything lands in a cache directory outside the repository ($FASTDLLM_VS_LLAMACPP or
~/.cache/fastdllm-vs-llamacpp/), each step done once:

- the llama-cpp-python sdist (pip download --no-binary :all: --no-deps), whose vendor/llama.cpp
  is the llama.cpp that is built;
- cmake, Release, GGML_NATIVE (-march=native), targets llama-diffusion-cli, llama-quantize and
  llama-diffusion-ids only, built with --jobs (default: all cores);
- llama-diffusion-ids: examples/diffusion/diffusion-cli.cpp itself with three insertions (a prompt
  given as "ids:1,2,3" is taken as token ids instead of being templated and tokenized; the ids
  of the prompt and of the canvas after generation, the number of forwards and the time of
  diffusion_generate are printed on stdout). Every other line, the parameters it passes to
  diffusion_generate included, is the CLI's; vs_llamacpp.py runs the unmodified CLI beside it once
  to show that both give the same text;
- random Dream-format checkpoints (fastdllm's Dream classes, std 0.02 on every matrix, bf16 on
  disk, Dream-v0-Instruct-7B's real config keys and tokenizer files);
- GGUFs by llama.cpp's own convert_hf_to_gguf.py (its vendored gguf-py and a sentencepiece
  installed with pip --target into the cache on PYTHONPATH; nothing installed into the venv) at f32 and bf16, and llama-quantize's q8_0 and q4_0 from the f32 file (its default
  tensor choices: what a user of llama-quantize gets).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import harness

CACHE = Path(os.environ.get("FASTDLLM_VS_LLAMACPP", Path.home() / ".cache" / "fastdllm-vs-llamacpp"))
PACKAGE = "llama-cpp-python"
TARGETS = ("llama-diffusion-cli", "llama-quantize", "llama-diffusion-ids")
GGUF_TYPES = ("f32", "bf16", "q8_0", "q4_0")

SHAPES = {name: harness.SHAPES[name] for name in ("22m", "0.5b", "1.5b")}      # random Dream-format checkpoints


def log(msg: str) -> None:
    print(f"[llamacpp_build] {msg}", file=sys.stderr, flush=True)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    log(" ".join(map(str, cmd)))
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


# -- source ------------------------------------------------------------------------------------

def source(version: str | None = None) -> Path:
    """The vendored llama.cpp of the llama-cpp-python sdist (`version` or the newest), extracted."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    if version:
        found = [p for p in found if p.name == f"llama_cpp_python-{version}.tar.gz"]
    if not found:
        spec = f"{PACKAGE}=={version}" if version else PACKAGE
        run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", CACHE, spec])
        found = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    sdist = found[-1]
    root = CACHE / sdist.name.removesuffix(".tar.gz")
    if not root.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE, filter="data")
    return root / "vendor" / "llama.cpp"


def describe(src: Path) -> dict:
    """The sdist's version, llama.cpp's commit (its .git when the sdist ships one) and ggml version."""
    info = {"llama_cpp_python": src.parent.parent.name.removeprefix("llama_cpp_python-"), "llama_cpp_commit": "unknown"}
    try:
        info["llama_cpp_commit"] = subprocess.run(["git", "-C", src, "rev-parse", "--short=12", "HEAD"], check=True,
                                                  capture_output=True, text=True).stdout.strip()
        info["llama_cpp_date"] = subprocess.run(["git", "-C", src, "log", "-1", "--format=%cs"], check=True,
                                                capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    cml = (src / "ggml" / "CMakeLists.txt").read_text()
    if m := re.search(r"set\(GGML_VERSION_MAJOR (\d+)\).*?set\(GGML_VERSION_MINOR (\d+)\).*?set\(GGML_VERSION_PATCH (\d+)\)",
                      cml, re.S):
        info["ggml"] = ".".join(m.groups())
    return info


# -- the ids driver: diffusion-cli.cpp with three insertions ----------------------------------------

_PATCHES = [  # (anchor in diffusion-cli.cpp, text inserted before it)
    ("struct callback_data {",
     "#include <cstdio>\n#include <sstream>\nstatic int g_forwards = 0;  // vs_llamacpp: one callback per forward\n\n"),
    ("    callback_data * data = static_cast<callback_data *>(user_data);",
     "    g_forwards++;\n"),
    ("    int n_input = input_tokens.size();",
     "    if (params.prompt.rfind(\"ids:\", 0) == 0) {  // vs_llamacpp: the prompt as token ids\n"
     "        input_tokens.clear();\n"
     "        std::stringstream ss(params.prompt.substr(4));\n"
     "        for (std::string t; std::getline(ss, t, ',');) { input_tokens.push_back(std::stoi(t)); }\n"
     "    }\n"),
    ("    if (n_generated > 0) {",
     "    {  // vs_llamacpp: ids out\n"
     "        printf(\"prompt_ids:\");\n"
     "        for (int i = 0; i < n_input; i++) { printf(i ? \",%d\" : \"%d\", input_tokens[i]); }\n"
     "        printf(\"\\ncanvas_ids:\");\n"
     "        for (int i = n_input; i < n_generated; i++) { printf(i > n_input ? \",%d\" : \"%d\", output_tokens[i]); }\n"
     "        printf(\"\\nforwards: %d\\ngenerate_us: %lld\\n\", g_forwards, (long long) (ggml_time_us() - t_gen));\n"
     "        fflush(stdout);\n"
     "    }\n"),
    ("    diffusion_generate(ctx, input_tokens.data()",
     "    const int64_t t_gen = ggml_time_us();  // vs_llamacpp\n"),
]
_CMAKE = """
# fastdllm benchmarks/llamacpp_build.py: diffusion-cli.cpp with prompt ids in, canvas ids out
add_executable(llama-diffusion-ids diffusion-ids.cpp)
target_link_libraries(llama-diffusion-ids PRIVATE llama-diffusion llama llama-common ${CMAKE_THREAD_LIBS_INIT})
target_compile_features(llama-diffusion-ids PRIVATE cxx_std_17)
"""


def add_ids_driver(src: Path) -> None:
    d = src / "examples" / "diffusion"
    text = (d / "diffusion-cli.cpp").read_text()
    for anchor, insert in _PATCHES:
        if text.count(anchor) != 1:
            raise SystemExit(f"diffusion-cli.cpp changed: anchor {anchor!r} found {text.count(anchor)} times")
        text = text.replace(anchor, insert + anchor)
    if not (d / "diffusion-ids.cpp").exists() or (d / "diffusion-ids.cpp").read_text() != text:
        (d / "diffusion-ids.cpp").write_text(text)
    cml = (d / "CMakeLists.txt").read_text()
    if "llama-diffusion-ids" not in cml:
        (d / "CMakeLists.txt").write_text(cml + _CMAKE)


# -- build ---------------------------------------------------------------------------------------

def build(src: Path, jobs: int | None = None) -> dict[str, Path]:
    """Configure once (Release, native, examples and tools, no tests/server/curl), build the targets."""
    add_ids_driver(src)
    out = CACHE / "build"
    if not (out / "CMakeCache.txt").exists():
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        run(["cmake", "-S", src, "-B", out, *gen, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
             "-DBUILD_SHARED_LIBS=OFF"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", out, "--target", *TARGETS, "-j", jobs or os.cpu_count()], stdout=subprocess.DEVNULL)
    return {t: out / "bin" / t for t in TARGETS}


# -- checkpoints and GGUFs -------------------------------------------------------------------------

def write_checkpoint(shape: str, seed: int = 0) -> Path:
    """A random Dream-format checkpoint of `shape` (bf16 on disk), written once."""
    out = CACHE / "checkpoints" / shape
    if (out / "config.json").exists():
        return out
    import torch

    from fastdllm.testing.tiny_random import FIXTURES
    from fastdllm.models import DreamConfig, DreamModel

    fixtures = FIXTURES / "Dream-v0-Instruct-7B"
    published = json.loads((fixtures / "config.json").read_text())
    published.update(SHAPES[shape].config)
    torch.manual_seed(seed)
    model = DreamModel(DreamConfig.from_dict(published))
    harness.randomize(model)
    tmp = out.with_name(shape + ".tmp")
    model.to(torch.bfloat16).save_pretrained(tmp, max_shard_size="2GB")
    del model
    for name in ("vocab.json", "merges.txt", "added_tokens.json", "tokenizer_config.json",
                 "special_tokens_map.json", "generation_config.json"):
        shutil.copyfile(fixtures / name, tmp / name)
    (tmp / "config.json").write_text(json.dumps(dict(published, torch_dtype="bfloat16"), indent=2) + "\n")
    tmp.rename(out)
    return out


def converter_view(ckpt: Path) -> Path:
    """The checkpoint as llama.cpp's converter can read it: the same files (links), but a
    tokenizer_config.json naming Qwen2Tokenizer: Dream's DreamTokenizer is Qwen2's byte-level BPE
    whose remote code (tokenization_dream.py) the published files' copy here does not carry."""
    view = ckpt.with_name(ckpt.name + ".converter")
    view.mkdir(exist_ok=True)
    for f in ckpt.iterdir():
        if f.name != "tokenizer_config.json" and not (view / f.name).exists():
            (view / f.name).symlink_to(f.resolve())
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg.pop("auto_map", None)
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    (view / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return view


def converter_deps() -> Path:
    """sentencepiece, which the converter imports before it looks for a tokenizer.model (Dream has
    none: it falls back to the BPE vocabulary), installed into the cache, not into the venv."""
    deps = CACHE / "pydeps"
    if not (deps / "sentencepiece").exists():
        run([sys.executable, "-m", "pip", "install", "-q", "--target", deps, "sentencepiece"])
    return deps


def gguf(shape: str, kind: str, src: Path, bins: dict[str, Path]) -> Path:
    """The GGUF of `shape` at `kind` (f32, bf16: convert_hf_to_gguf.py; q8_0, q4_0: llama-quantize)."""
    out = CACHE / "gguf" / f"{shape}-{kind}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part")
    with open(out.with_suffix(".log"), "w") as logf:
        if kind in ("f32", "bf16"):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [src / "gguf-py", converter_deps()])))
            run([sys.executable, src / "convert_hf_to_gguf.py", converter_view(write_checkpoint(shape)),
                 "--outtype", kind, "--outfile", part], env=env, stdout=logf, stderr=logf)
        else:
            run([bins["llama-quantize"], gguf(shape, "f32", src, bins), part, kind.upper(), os.cpu_count()],
                stdout=logf, stderr=logf)
    part.rename(out)
    return out


def prepare(shapes: list[str], kinds=GGUF_TYPES, version: str | None = None, jobs: int | None = None) -> dict:
    """Build, write and convert what `shapes` need; returns paths and versions."""
    src = source(version)
    bins = build(src, jobs)
    files = {shape: {"checkpoint": write_checkpoint(shape), **{k: gguf(shape, k, src, bins) for k in kinds}}
             for shape in shapes}
    return {"src": src, "bins": bins, "files": files, "info": describe(src)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", default=[], choices=list(SHAPES))
    ap.add_argument("--version", help=f"{PACKAGE} version (default: the newest on the index / in the cache)")
    ap.add_argument("--jobs", type=int, help="build jobs (default: all cores)")
    args = ap.parse_args()
    done = prepare(args.shape, version=args.version, jobs=args.jobs)
    print(json.dumps({"cache": str(CACHE), **done["info"], "bins": {k: str(v) for k, v in done["bins"].items()},
                      "files": {s: {k: str(v) for k, v in f.items()} for s, f in done["files"].items()}}, indent=2))


if __name__ == "__main__":
    main()
