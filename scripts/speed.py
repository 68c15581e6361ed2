#!/usr/bin/env python3
"""Per-step cost of the three cache modes on a random LLaDA-shaped model (a benchmark, not a test).

    python scripts/speed.py                                  # the issue's CPU shape, bf16
    python scripts/speed.py --d-model 4096 --layers 32 --heads 32 --mlp 12288 --vocab 126464 \
        --prompt 512 --gen-len 256,1024 --device cuda        # LLaDA-8B shape on a GPU

Prints one line per (gen_len, mode): NFE, ms per step, total seconds, with the conditions.
Warm-up runs are not counted; the device is synchronised before reading clocks (the engine's
per-step transfer already does that).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from fastdllm import loading
from fastdllm.config import DecodeConfig
from fastdllm.engine import run
from fastdllm.tiny_random import FIXTURES, write_llada


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen-len", default="256")
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--modes", default="none,prefix,dual")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = write_llada(Path(tmp) / "m", d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                           mlp_hidden_size=args.mlp, vocab_size=args.vocab, fixtures=args.fixtures,
                           max_sequence_length=8192, shard_bytes="2GB")
        lm = loading.load(path, dtype=args.dtype, device=args.device)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, min(args.vocab, 300), (args.prompt,), generator=g).tolist()
    print(f"# model: random LLaDA d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"MLP {args.mlp}, vocab {args.vocab}; {args.dtype} on {lm.device} "
          f"({torch.cuda.get_device_name() if lm.device.type == 'cuda' else platform.processor() or 'cpu'}, "
          f"{torch.get_num_threads()} threads); torch {torch.__version__}")
    print(f"# prompt {args.prompt} tokens, block {args.block_len}, fixed rule, one token per step")
    for gen_len in map(int, args.gen_len.split(",")):
        for mode in args.modes.split(","):
            cfg = DecodeConfig(gen_len=gen_len, block_len=args.block_len, cache=mode, rule="fixed", early_stop=False)
            run(lm, [prompt], DecodeConfig(gen_len=args.block_len * 2, block_len=args.block_len, cache=mode,
                                          rule="fixed", early_stop=False))   # warm-up
            start = time.perf_counter()
            result = run(lm, [prompt], cfg)
            total = time.perf_counter() - start
            print(f"gen_len {gen_len:5d}  {mode:6s}  NFE {result.nfe:5d}  {1000 * total / result.nfe:8.2f} ms/step  "
                  f"{total:7.2f} s  cache {result.cache_bytes / 2**20:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
