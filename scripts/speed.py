#!/usr/bin/env python3
"""Per-step cost of the three cache modes on a random LLaDA-shaped model (a benchmark, not a test).

    python scripts/speed.py                                  # the issue's CPU shape, bf16
    python scripts/speed.py --d-model 4096 --layers 32 --heads 32 --mlp 12288 --vocab 126464 \
        --prompt 512 --gen-len 256,1024 --device cuda --in-memory   # LLaDA-8B shape on a GPU

Prints one line per (gen_len, mode): NFE, ms per step, total seconds, with the conditions.
Warm-up runs are not counted; the device is synchronised before reading clocks (the engine's
per-step transfer already does that).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.tiny_random import FIXTURES, write_llada
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.models import FAMILIES


def build_in_memory(args, tmp: Path) -> loading.LoadedModel:
    """The shape built directly on the device with random weights (std 0.02): writing and reading
    back an 8B checkpoint would take minutes. Tokenizer and special tokens come from a one-layer
    checkpoint of the same vocabulary loaded the normal way."""
    path = write_llada(tmp / "m", d_model=64, n_layers=1, n_heads=4, mlp_hidden_size=128, vocab_size=args.vocab,
                       fixtures=args.fixtures, max_sequence_length=8192)
    lm = loading.load(path, dtype=args.dtype, device=args.device)
    return in_memory(lm, "llada", dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                                       n_kv_heads=args.heads, mlp_hidden_size=args.mlp))


def in_memory(lm: loading.LoadedModel, family_type: str, overrides: dict) -> loading.LoadedModel:
    """Swap `lm`'s model for a random one (std 0.02) of its family with `overrides` on its config,
    built on its device and dtype."""
    config_cls, model_cls, _ = FAMILIES[family_type][0]
    config = config_cls.from_dict({**lm.model.config.to_dict(), **overrides})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(lm.dtype)
    try:
        with torch.device(lm.device), torch.no_grad():
            model = model_cls(config).eval()
            for p in model.parameters():
                if p.ndim == 2:
                    p.normal_(0.0, 0.02)
    finally:
        torch.set_default_dtype(default)
    model.prepare_for_inference()
    lm.model = model
    lm.info = loading.describe(lm)
    return lm


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
    ap.add_argument("--in-memory", action="store_true", help="build the weights on the device, no checkpoint on disk")
    ap.add_argument("--graphs", default="on", help="CUDA graphs: on, off, or off,on to compare (FASTDLLM_CUDA_GRAPHS)")
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="memory bytes/s for the weight-read bound (H200: 4.8e12)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.in_memory:
            lm = build_in_memory(args, Path(tmp))
        else:
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
    # every weight is read once per step except the input embedding, of which only a few rows are
    embed = lm.model.get_input_embeddings().weight
    read_bytes = lm.info["weights_bytes"] - embed.numel() * embed.element_size()
    bound_ms = 1000 * read_bytes / args.bandwidth
    print(f"# weights read per step {read_bytes / 2**30:.2f} GiB (all but the input embedding): "
          f"{bound_ms:.2f} ms at {args.bandwidth / 1e12:.1f} TB/s, the weight-read bound of one step")
    for gen_len in map(int, args.gen_len.split(",")):
        for mode, graphs in ((m, g) for m in args.modes.split(",") for g in args.graphs.split(",")):
            os.environ["FASTDLLM_CUDA_GRAPHS"] = "1" if graphs == "on" else "0"
            cfg = DecodeConfig(gen_len=gen_len, block_len=args.block_len, cache=mode, rule="fixed", early_stop=False)
            run(lm.decoder, [prompt], DecodeConfig(gen_len=args.block_len * 2, block_len=args.block_len, cache=mode,
                                          rule="fixed", early_stop=False))   # warm-up
            start = time.perf_counter()
            result = run(lm.decoder, [prompt], cfg)
            total = time.perf_counter() - start
            label = f"{mode}, graphs {graphs}" if lm.device.type == "cuda" else mode
            print(f"gen_len {gen_len:5d}  {label:17s}  NFE {result.nfe:5d}  {1000 * total / result.nfe:8.2f} ms/step  "
                  f"{total:7.2f} s  cache {result.cache_bytes / 2**20:.1f} MiB  "
                  f"{1000 * total / result.nfe / bound_ms:5.2f}x weight-read bound", flush=True)


if __name__ == "__main__":
    main()
