#!/usr/bin/env python3
"""Training tokens/s of a built-in-model shape on this CPU, with and without bf16 autocast: one
forward + backward + AdamW step on random ids, best of a few steps (the first is not counted).

    python scripts/train_throughput.py                      # the 8.9M and 4.5M shapes
    python scripts/train_throughput.py --shapes 256x8x768 --batch 32 --seq 192 --threads 2

On a CPU without bf16 kernels (models.cpu.bf16_native() False) autocast is emulated and slow; the
trainer (fastdllm/training/data.autocast) uses fp32 there.
"""

from __future__ import annotations

import argparse
import time

import torch

from fastdllm.models import LLaDAConfig, LLaDAModelLM, cpu


def step_rate(d_model: int, layers: int, mlp: int, batch: int, seq: int, autocast: bool, steps: int = 4) -> float:
    heads = d_model // 32
    config = LLaDAConfig(d_model=d_model, n_heads=heads, n_kv_heads=heads, n_layers=layers, mlp_hidden_size=mlp,
                         vocab_size=4096, embedding_size=4096, max_sequence_length=1024, rope_theta=10000.0,
                         mask_token_id=5, eos_token_id=1, pad_token_id=1, bos_token_id=0)
    model = LLaDAModelLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 4096, (batch, seq))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 4096), ids.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return batch * seq / min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="256x8x768,192x6x576", help="d_model x layers x MLP, comma-separated")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=192)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU capability {cpu.capability()}, {cpu.bf16_note()}; batch {args.batch} x {args.seq}, {args.threads} threads")
    for shape in args.shapes.split(","):
        d, layers, mlp = map(int, shape.split("x"))
        rates = {name: step_rate(d, layers, mlp, args.batch, args.seq, name == "bf16 autocast")
                 for name in ("bf16 autocast", "fp32")}
        print(f"d{d} x {layers} layers, MLP {mlp}: " + ", ".join(f"{k} {v:,.0f} tokens/s" for k, v in rates.items()))


if __name__ == "__main__":
    main()
