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

`--kernels 25` decodes each line once more under torch's profiler and prints its 25 costliest
kernels (device time over the whole decode: where a step's time goes).

On one CUDA device greedy steps of these models run the device step, each cached step one CUDA
graph (decode/device_step.py); `--graphs off,on` compares with no graphs at all.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import harness

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_random import FIXTURES
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import StepEvent, generate, run


def main() -> None:
    ap = harness.parser(__doc__, reps=None, device="cpu", dtype="bf16")
    harness.add_llada_shape(ap)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen-len", default="256")
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--modes", default="none,prefix,dual")
    ap.add_argument("--quantize", default="none", help="none | int8 | int4 | 8bit | 4bit (8bit/4bit: not --in-memory)")
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--in-memory", action="store_true", help="build the weights on the device, no checkpoint on disk")
    ap.add_argument("--graphs", default="on", help="CUDA graphs: on, off, or off,on to compare (FASTDLLM_CUDA_GRAPHS)")
    ap.add_argument("--bandwidth", type=float, default=None, help="memory bytes/s for the weight-read bound (default: measured)")
    ap.add_argument("--batch", default="1", help="rows per batch, e.g. 1,8,32 (the prompt in every row)")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="after each line, decode once more under torch's profiler and print its N costliest kernels")
    args = harness.parse(ap)

    shape = harness.llada_shape(args, fixtures=args.fixtures)
    if args.in_memory:
        lm = harness.build(shape, args.dtype, args.device, args.quantize)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = harness.write_random(shape, Path(tmp) / "m")
            lm = loading.load(path, dtype=args.dtype, device=args.device, quantize=args.quantize)
    prompt = harness.prompt_ids(args.prompt, high=min(args.vocab, 300))
    print(f"# model: {shape.text}; {args.dtype} (quantize {args.quantize}) on {harness.machine(lm.device, args.dtype)}")
    print(f"# prompt {args.prompt} tokens, block {args.block_len}, fixed rule, one token per step")
    bound_ms = weight_read_bound(lm, args)
    records = []
    for gen_len in harness.csv(args.gen_len, int):
        for mode, graphs in ((m, g) for m in harness.csv(args.modes) for g in harness.csv(args.graphs)):
            os.environ["FASTDLLM_CUDA_GRAPHS"] = "1" if graphs == "on" else "0"
            cfg = DecodeConfig(gen_len=gen_len, block_len=args.block_len, cache=mode, rule="fixed", early_stop=False)
            label = f"{mode}, graphs {graphs}" if lm.device.type == "cuda" else mode
            for batch in harness.csv(args.batch, int):
                record = speed_line(lm, [prompt] * batch, cfg, f"gen_len {gen_len:5d}  {label:17s}  batch {batch:2d}",
                                    bound_ms)
                records.append(dict(gen_len=gen_len, mode=mode, graphs=graphs, batch=batch, **record))
                if args.kernels:
                    print(kernel_table(lm, [prompt] * batch, cfg, args.kernels), flush=True)
    harness.write_json(args, records, model=shape.text, prompt=args.prompt, block_len=args.block_len,
                       weight_read_bound_ms=bound_ms)


def weight_read_bound(lm, args) -> float:
    """ms of one step's weight reads at the read bandwidth (given, or measured), printed."""
    # every weight is read once per step except the input embedding, of which only a few rows are
    embed = lm.model.get_input_embeddings().weight
    read_bytes = lm.info["weights_bytes"] - embed.numel() * embed.element_size()
    bandwidth = args.bandwidth or harness.read_bandwidth(lm.device)
    bound_ms = 1000 * read_bytes / bandwidth
    print(f"# weights read per step {read_bytes / 2**30:.2f} GiB (all but the input embedding), read bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s ({'given' if args.bandwidth else 'measured'}): {bound_ms:.2f} ms, "
          f"the weight-read bound of one step (of any batch: the weights are read once per step)")
    return bound_ms


def speed_line(lm, prompts: list[list[int]], cfg: DecodeConfig, label: str, bound_ms: float) -> dict:
    """Warm up (two blocks), then decode `prompts` once under `cfg`, timing each step between step
    events (each step's one device-to-host transfer synchronises); print the line, return its record."""
    run(lm.decoder, prompts, DecodeConfig.from_dict({"gen_len": cfg.block_len * 2}, cfg))   # warm-up
    cached, last = [], harness.clock(lm.device)
    start = last
    for event in generate(lm.decoder, prompts, cfg):
        now = time.perf_counter()
        if isinstance(event, StepEvent) and (event.span[0] > 0 or cfg.cache == "none"):
            cached.append(1000 * (now - last))           # a step reusing the cache (none: every step)
        last = now
    result, total = event, time.perf_counter() - start
    step = harness.spread(cached)
    print(f"{label}  NFE {result.nfe:5d}  {1000 * total / result.nfe:8.2f} ms/step  cached step {step['median']:8.2f} ms  "
          f"{total:7.2f} s  {result.committed / total:8.1f} tok/s  cache {result.cache_bytes / 2**20:.1f} MiB  "
          f"{step['median'] / bound_ms:5.2f}x weight-read bound", flush=True)
    return dict(nfe=result.nfe, ms_per_step=1000 * total / result.nfe, cached_step_ms=step, seconds=total,
                tokens_per_second=result.committed / total, cache_bytes=result.cache_bytes)


def kernel_table(lm, prompts: list[list[int]], cfg: DecodeConfig, rows: int) -> str:
    """The `rows` costliest operations of one more decode under torch's profiler, by device time
    (CUDA kernels, graph replays included; on a CPU, by CPU time), totals over the whole decode."""
    from torch.profiler import ProfilerActivity, profile
    cuda = lm.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run(lm.decoder, prompts, cfg)
    return prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                     row_limit=rows, max_name_column_width=60)


if __name__ == "__main__":
    main()
