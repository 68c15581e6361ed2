#!/usr/bin/env python3
"""Block-diffusion decoding cost on random models of the published shapes (a benchmark, not a test).

    python benchmarks/blockdiff_speed.py                          # CPU, fp32: SDAR-1.7B and v2-1.5B shapes
    python benchmarks/blockdiff_speed.py --device cuda --dtype bf16 --shapes sdar-8b,v2-7b --graphs off,on

For each shape: ms per forward and tokens per forward of the family's own profile rule and of one
token per step, and, at the same hidden size and answer length, a bidirectional LLaDA-style model
decoded with DualCache (one token per step, blocks of 32): the cost per generated token of the two
ways of caching. Weights are random (std 0.02), built on the device: confidences, hence tokens per
forward of the threshold rules, say little about a trained model; per-forward costs are the point.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from speed import (
    in_memory,  # benchmarks/speed.py: random weights of any shape, on the device
)

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.tiny_blockdiff import write_fast_dllm_v2, write_sdar
from fastdllm.checkpoints.tiny_random import write_llada
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run

# name -> (family writer, config overrides of the published shape)
SHAPES = {
    "sdar-1.7b": ("sdar", dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                               head_dim=128, intermediate_size=6144)),
    "sdar-8b": ("sdar", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, intermediate_size=12288)),
    "v2-1.5b": ("v2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                           intermediate_size=8960, tie_word_embeddings=True, vocab_size=151936)),
    "v2-7b": ("v2", dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                         intermediate_size=18944)),
}
PROFILES = {"sdar": dict(block_len=4, rule="dynamic", threshold=0.95, cache="prefix"),
            "v2": dict(block_len=32, sub_block_len=8, rule="dynamic", threshold=0.9, cache="prefix")}


def timed(lm, prompt, cfg) -> tuple[float, object]:
    run(lm.decoder, [prompt], DecodeConfig.from_dict({"gen_len": cfg.block_len * 2}, cfg))   # warm-up
    start = time.perf_counter()
    result = run(lm.decoder, [prompt], cfg)
    return time.perf_counter() - start, result


def report(label: str, seconds: float, result, gen_len: int) -> None:
    print(f"  {label:34s} NFE {result.nfe:4d}  {1000 * seconds / result.nfe:8.1f} ms/forward  "
          f"{result.committed / result.nfe:5.2f} tok/forward  {1000 * seconds / gen_len:8.1f} ms per token  "
          f"{seconds:7.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="sdar-1.7b,v2-1.5b")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--graphs", default="on", help="CUDA graphs: on, off, or off,on (FASTDLLM_CUDA_GRAPHS)")
    args = ap.parse_args()
    print(f"# {args.dtype} on {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else platform.processor() or 'cpu'}, "
          f"{torch.get_num_threads()} threads), torch {torch.__version__}; prompt {args.prompt}, gen_len {args.gen_len}, "
          f"no early stop, random weights")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes.split(","):
            family, shape = SHAPES[name]
            write = write_sdar if family == "sdar" else write_fast_dllm_v2
            tiny = loading.load(write(Path(tmp) / name, n_layers=1), dtype=args.dtype, device=args.device)
            if "layer_types" in tiny.model.config.to_dict():              # v2 configs list one per layer
                shape = {**shape, "layer_types": ["full_attention"] * shape["num_hidden_layers"]}
            lm = in_memory(tiny, tiny.family, shape)
            prompt = torch.randint(1000, 30000, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
            print(f"{name}: {lm.info['parameters'] / 1e9:.2f} B parameters, attention {lm.info['attention']}")
            for graphs in args.graphs.split(",") if args.device.startswith("cuda") else ["off"]:
                os.environ["FASTDLLM_CUDA_GRAPHS"] = "1" if graphs == "on" else "0"
                suffix = f", graphs {graphs}" if args.device.startswith("cuda") else ""
                own = DecodeConfig(gen_len=args.gen_len, early_stop=False, **PROFILES[family])
                one = DecodeConfig.from_dict({"rule": "fixed", "threshold": 0.9}, own)
                for label, cfg in ((f"{family} profile rule{suffix}", own), (f"one token per step{suffix}", one)):
                    report(label, *timed(lm, prompt, cfg), args.gen_len)
            del lm, tiny
            # the same hidden size, layers and answer length, bidirectional, DualCache
            llada = loading.load(write_llada(Path(tmp) / f"{name}-llada", d_model=64, n_layers=1, n_heads=4,
                                             mlp_hidden_size=128, vocab_size=shape.get("vocab_size", 151936)),
                                 dtype=args.dtype, device=args.device)
            llada = in_memory(llada, "llada", dict(d_model=shape["hidden_size"], n_layers=shape["num_hidden_layers"],
                                                   n_heads=shape["num_attention_heads"],
                                                   n_kv_heads=shape["num_key_value_heads"],
                                                   mlp_hidden_size=shape["intermediate_size"]))
            dual = DecodeConfig(gen_len=args.gen_len, block_len=32, cache="dual", rule="fixed", early_stop=False)
            report("LLaDA-style DualCache, 1/step", *timed(llada, prompt, dual), args.gen_len)
            del llada


if __name__ == "__main__":
    main()
