"""Peak resident memory of loading a Q4_K_M GGUF file kept quantized (docs/specs/gguf.md 11), against the
file's size. Builds a LLaDA-shaped file of a few hundred MB once (random weights, the tests' writer:
tests/gguf/test_gguf.py's write_gguf with tests/gguf/test_gguf_int4.py's Q4_K_M mix), then loads it in a fresh
process per case and reads that process's peak RSS (ru_maxrss).

    OMP_NUM_THREADS=1 python scripts/gguf_load_memory.py [--out /tmp/gguf-memory]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOAD = """
import json, resource, sys, torch
from fastdllm.checkpoints import gguf_file, loading
from fastdllm.checkpoints.locate import resolve_model_dir
path, case = sys.argv[1], sys.argv[2]
folder = resolve_model_dir(path)                 # the small folder first: not part of the load
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if case == "no-release":
    gguf_file.release = lambda f, t: None
    import fastdllm.checkpoints.gguf_int8 as kept; kept.release = gguf_file.release
# fp16: the float route, every weight dequantized (bf16's size; --dtype bf16 would load it as int4)
kwargs = {"int4": {}, "no-release": {}, "int8": {"quantize": "int8"}, "fp16 (dequantized)": {"dtype": "fp16"}}[case]
lm = loading.load(folder, **kwargs)
held = sum(t.numel() * t.element_size() for t in list(lm.model.parameters()) + list(lm.model.buffers()))
print(json.dumps({"before_kib": before, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "model_bytes": held, "quantize": lm.quantize}))
"""


def build(out: Path) -> Path:
    """The file, written once, in a child process: the kernel carries a process's peak RSS across
    exec, so this process stays small and never imports torch."""
    path = out / "llada-mem-Q4_K_M.gguf"
    if not path.is_file():
        subprocess.run([sys.executable, "-c", BUILD, str(out), str(path)], check=True, cwd=ROOT)
    return path


BUILD = """
import sys, torch
from pathlib import Path
from fastdllm.testing.tiny_random import write_llada
sys.path[:0] = ["tests", "tests/gguf"]
from test_gguf import write_gguf
from test_gguf_int4 import q4_k_m
out, path = Path(sys.argv[1]), Path(sys.argv[2])
src = write_llada(out / "llada-mem", d_model=2048, mlp_hidden_size=5632, n_layers=6, n_heads=16, vocab_size=32000,
                  shard_bytes="8GB", dtype=torch.bfloat16)
write_gguf(src, path, q4_k_m)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("/tmp/gguf-memory"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = build(args.out)
    size = path.stat().st_size
    print(f"{path.name}: {size / 2**20:.0f} MiB on disk")
    for case in ("int4", "no-release", "int8", "fp16 (dequantized)"):
        r = subprocess.run([sys.executable, "-c", LOAD, str(path), case], capture_output=True, text=True, cwd=ROOT)
        if r.returncode:
            print(case, "failed:", r.stderr.strip().splitlines()[-1])
            continue
        got = json.loads(r.stdout.strip().splitlines()[-1])
        rise = (got["peak_kib"] - got["before_kib"]) * 1024
        print(f"{case:<20} peak RSS {got['peak_kib'] / 2**10:7.0f} MiB (imports and folder {got['before_kib'] / 2**10:.0f}); "
              f"the load adds {rise / 2**20:6.0f} MiB = {rise / size:.2f}x the file; the model holds "
              f"{got['model_bytes'] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
