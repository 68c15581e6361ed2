#!/usr/bin/env python3
"""Memory of the full published MoE checkpoints at bf16 / 8-bit / 4-bit, from parameter counts as
`fastdllm info` computes them (checkpoints/info.py; the model is built on the meta device: no weights),
against 24 GiB and 12 GiB GPUs (part 3 of benchmarks/moe_speed.py, which prints it too; issue 14).

    python benchmarks/moe_memory.py
    python benchmarks/moe_memory.py --prompt-len 512 --gen-len-memory 1024
"""

from __future__ import annotations

import argparse

import harness
import torch
from moe_shapes import (  # benchmarks/moe_shapes.py: the published shapes
    SHAPES,
    family,
    published,
)

from fastdllm.checkpoints.info import memory_estimate, shape_summary

GPUS_GIB = (24, 12)
HEADROOM_GIB = 1.0        # CUDA context, allocator slack, activations and logits of a step


def memory(args) -> None:
    """`fastdllm info`'s estimate (checkpoints/info.py) for the full published shapes, from the tensor
    shapes a checkpoint would hold: the model built on the meta device, nothing allocated."""
    canvas = args.prompt_len + args.gen_len_memory
    print(f"\n### Memory of the full published shapes (weights + bf16 KV cache of {canvas} tokens, as "
          f"`fastdllm info -n {args.gen_len_memory} --prompt-len {args.prompt_len}`)\n")
    print("| shape | parameters | active / token | weights | bf16 | 8-bit | 4-bit |")
    print("|---|---|---|---|---|---|---|")
    fits = []
    for name in SHAPES:
        raw = published(name)
        config, model_cls = family(raw)
        with torch.device("meta"):
            model = model_cls(config)
        shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
        info = shape_summary(shapes, config)
        est = memory_estimate(info, canvas)
        cells = []
        for q, e in est.items():
            total = e["total"] / 2**30
            cells.append(f"{total:.1f} GiB")
            fits.append(f"{name} {q}: " + ", ".join(
                f"{gpu} GiB {'yes' if total <= gpu - HEADROOM_GIB else 'no'} ({gpu - total:+.1f} GiB left)" for gpu in GPUS_GIB))
        print(f"| {name} | {info['parameters'] / 1e9:.2f} B | {info['active_parameters'] / 1e9:.2f} B | "
              f"bf16 {est['bf16']['weights'] / 2**30:.1f} GiB, cache {est['bf16']['cache'] / 2**20:.0f} MiB | "
              + " | ".join(cells) + " |")
        del model
    print(f"\nFits a GPU when weights + cache leave {HEADROOM_GIB:.0f} GiB free (CUDA context, allocator, "
          f"a step's activations and logits); 8- and 4-bit are bitsandbytes on the blocks' matrices "
          f"(routers, embedding and head stay bf16; NF4 adds an fp32 scale per 64 weights):\n")
    for line in fits:
        print(f"- {line}")


def add_memory_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--prompt-len", type=int, default=128, help="memory estimate: prompt tokens")
    ap.add_argument("--gen-len-memory", type=int, default=256, help="memory estimate: generated tokens")


def main() -> None:
    ap = harness.parser(__doc__, reps=None)
    add_memory_args(ap)
    memory(harness.parse(ap))


if __name__ == "__main__":
    main()
