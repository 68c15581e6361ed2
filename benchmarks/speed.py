#!/usr/bin/env python3
"""Per-step cost of the three cache modes on a random LLaDA-shaped model (a benchmark, not a test).

    python benchmarks/speed.py                                  # the issue's CPU shape, bf16
    python benchmarks/speed.py --d-model 4096 --layers 32 --heads 32 --mlp 12288 --vocab 126464 \
        --prompt 512 --gen-len 256,1024 --device cuda --in-memory   # LLaDA-8B shape on a GPU
    python benchmarks/speed.py --d-model 4096 --layers 32 --heads 32 --mlp 12288 --vocab 126464 \
        --prompt 512 --gen-len 256 --modes dual,prefix --graphs off,on --batch 1,8,32 \
        --device cuda --in-memory                                   # the device step's check (issue 26)

Prints one line per (gen_len, mode, batch): NFE, ms per step, the median ms of a cached step (one
that reuses the cache: not a refresh of the whole canvas; under `none` every step), total seconds,
tokens per second over the batch, and the cached step against the weight-read bound: the bytes of
weights one step reads (all but the input embedding) over the device's read bandwidth (measured
with one pass over a buffer unless `--bandwidth` is given). `--batch 1,8,32`: the prompt repeated
in every row. Warm-up runs are not counted; a step's time is between the engine's step events (each
step's one device-to-host transfer synchronises, so the clock reads finished work).

On one CUDA device greedy steps of these models run the device step, each cached step one CUDA
graph (decode/device_step.py); `--graphs off,on` compares with no graphs at all.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.tiny_random import FIXTURES, write_llada
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import StepEvent, generate, run
from fastdllm.models import FAMILIES


def build_in_memory(args, tmp: Path) -> loading.LoadedModel:
    """The shape built directly on the device with random weights (std 0.02): writing and reading
    back an 8B checkpoint would take minutes. Tokenizer and special tokens come from a one-layer
    checkpoint of the same vocabulary loaded the normal way."""
    path = write_llada(tmp / "m", d_model=64, n_layers=1, n_heads=4, mlp_hidden_size=128, vocab_size=args.vocab,
                       fixtures=args.fixtures, max_sequence_length=8192)
    lm = loading.load(path, dtype=args.dtype, device=args.device)
    return in_memory(lm, "llada", dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                                       n_kv_heads=args.heads, mlp_hidden_size=args.mlp), getattr(args, "quantize", "none"))


def in_memory(lm: loading.LoadedModel, family_type: str, overrides: dict, quantize: str = "none") -> loading.LoadedModel:
    """Swap `lm`'s model for a random one (std 0.02) of its family with `overrides` on its config,
    built on its device and dtype; `quantize` int8 / int4: converted as loading does."""
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
    if quantize in ("int8", "int4"):
        model.prepare_for_inference(pack=False)
        loading.cpu_quantize(model, quantize, lm.dtype, True, ())
        lm.quantize = quantize
    else:
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
    ap.add_argument("--quantize", default="none", help="none | int8 | int4 | 8bit | 4bit (8bit/4bit: not --in-memory)")
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--in-memory", action="store_true", help="build the weights on the device, no checkpoint on disk")
    ap.add_argument("--graphs", default="on", help="CUDA graphs: on, off, or off,on to compare (FASTDLLM_CUDA_GRAPHS)")
    ap.add_argument("--bandwidth", type=float, default=None, help="memory bytes/s for the weight-read bound (default: measured)")
    ap.add_argument("--batch", default="1", help="rows per batch, e.g. 1,8,32 (the prompt in every row)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.in_memory:
            lm = build_in_memory(args, Path(tmp))
        else:
            path = write_llada(Path(tmp) / "m", d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                               mlp_hidden_size=args.mlp, vocab_size=args.vocab, fixtures=args.fixtures,
                               max_sequence_length=8192, shard_bytes="2GB")
            lm = loading.load(path, dtype=args.dtype, device=args.device, quantize=args.quantize)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, min(args.vocab, 300), (args.prompt,), generator=g).tolist()
    print(f"# model: random LLaDA d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"MLP {args.mlp}, vocab {args.vocab}; {args.dtype} (quantize {args.quantize}) on {lm.device} "
          f"({torch.cuda.get_device_name() if lm.device.type == 'cuda' else platform.processor() or 'cpu'}, "
          f"{torch.get_num_threads()} threads); torch {torch.__version__}")
    print(f"# prompt {args.prompt} tokens, block {args.block_len}, fixed rule, one token per step")
    bound_ms = weight_read_bound(lm, args)
    for gen_len in map(int, args.gen_len.split(",")):
        for mode, graphs in ((m, g) for m in args.modes.split(",") for g in args.graphs.split(",")):
            os.environ["FASTDLLM_CUDA_GRAPHS"] = "1" if graphs == "on" else "0"
            cfg = DecodeConfig(gen_len=gen_len, block_len=args.block_len, cache=mode, rule="fixed", early_stop=False)
            label = f"{mode}, graphs {graphs}" if lm.device.type == "cuda" else mode
            for batch in map(int, args.batch.split(",")):
                speed_line(lm, [prompt] * batch, cfg, f"gen_len {gen_len:5d}  {label:17s}  batch {batch:2d}", bound_ms)


def weight_read_bound(lm, args) -> float:
    """ms of one step's weight reads at the read bandwidth (given, or measured), printed."""
    # every weight is read once per step except the input embedding, of which only a few rows are
    embed = lm.model.get_input_embeddings().weight
    read_bytes = lm.info["weights_bytes"] - embed.numel() * embed.element_size()
    bandwidth = args.bandwidth or read_bandwidth(lm.device)
    bound_ms = 1000 * read_bytes / bandwidth
    print(f"# weights read per step {read_bytes / 2**30:.2f} GiB (all but the input embedding), read bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s ({'given' if args.bandwidth else 'measured'}): {bound_ms:.2f} ms, "
          f"the weight-read bound of one step (of any batch: the weights are read once per step)")
    return bound_ms


def read_bandwidth(device: torch.device) -> float:
    """Bytes/s of one reading pass over a buffer (1 GiB on a GPU, 256 MiB on a CPU; best of 3),
    as benchmarks/moe_speed.py: what a weight-bound step can hope for."""
    x = torch.ones(2**28 if device.type == "cuda" else 2**26, device=device)
    best = float("inf")
    for _ in range(4):                           # the first pass warms up
        sync(device)
        start = time.perf_counter()
        x.sum()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return x.numel() * x.element_size() / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def speed_line(lm, prompts: list[list[int]], cfg: DecodeConfig, label: str, bound_ms: float) -> None:
    """Warm up (two blocks), then decode `prompts` once under `cfg`, timing each step between step
    events; print the line."""
    run(lm.decoder, prompts, DecodeConfig.from_dict({"gen_len": cfg.block_len * 2}, cfg))   # warm-up
    sync(lm.device)
    cached, last = [], time.perf_counter()
    start = last
    for event in generate(lm.decoder, prompts, cfg):
        now = time.perf_counter()
        if isinstance(event, StepEvent) and (event.span[0] > 0 or cfg.cache == "none"):
            cached.append(1000 * (now - last))           # a step reusing the cache (none: every step)
        last = now
    result, total = event, time.perf_counter() - start
    step_ms = statistics.median(cached)
    print(f"{label}  NFE {result.nfe:5d}  {1000 * total / result.nfe:8.2f} ms/step  cached step {step_ms:8.2f} ms  "
          f"{total:7.2f} s  {result.committed / total:8.1f} tok/s  cache {result.cache_bytes / 2**20:.1f} MiB  "
          f"{step_ms / bound_ms:5.2f}x weight-read bound", flush=True)

if __name__ == "__main__":
    main()
