"""How often a greedy answer changes when its request shares a batch with others.

Each prompt of a prompt set is decoded alone, then the whole set (each prompt --copies times,
shuffled, as concurrent requests arrive) in batches of --batch rows; an answer "flips" when its
tokens differ from the same prompt's alone. Run once per dtype and per --batch-invariant setting:

    python scripts/batch_invariance.py --dtypes fp32,bf16 --copies 4 --batch 8
    python scripts/batch_invariance.py --dtypes bf16 --batch-invariant

Prints one line per setting: flips, and the seconds the batched pass took.
"""

from __future__ import annotations

import argparse
import random
import time

from fastdllm.bench.prompts import builtin
from fastdllm.checkpoints.builtin import builtin_model_path
from fastdllm.checkpoints.loading import load
from fastdllm.decode import profiles
from fastdllm.decode.engine import run


def answers(lm, rows: list[list[int]], cfg, batch: int) -> list[tuple[int, ...]]:
    out = []
    for i in range(0, len(rows), batch):
        result = run(lm.decoder, rows[i:i + batch], cfg)
        out += [tuple(ids) for ids in result.ids]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=None, help="checkpoint folder (default: the built-in model)")
    parser.add_argument("--prompts", default="code", help="a built-in prompt set (bench's --prompts)")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--batch-invariant", action="store_true")
    args = parser.parse_args()
    model_dir = args.model or builtin_model_path()
    prompts = builtin(args.prompts).prompts
    for dtype in args.dtypes.split(","):
        lm = load(model_dir, dtype=dtype)
        flags = {"gen_len": args.gen_len, **({"batch_invariant": True} if args.batch_invariant else {})}
        cfg = profiles.resolve(profiles.find(profiles.default_profile_for(lm.path)), flags, lm.path)
        ids = [lm.encode(p) for p in prompts]
        alone = [answers(lm, [row], cfg, 1)[0] for row in ids]
        order = [i for i in range(len(ids)) for _ in range(args.copies)]
        random.Random(0).shuffle(order)
        start = time.perf_counter()
        batched = answers(lm, [ids[i] for i in order], cfg, args.batch)
        seconds = time.perf_counter() - start
        flips = sum(batched[k] != alone[i] for k, i in enumerate(order))
        print(f"{lm.path.name} {dtype} batch {args.batch} batch_invariant={args.batch_invariant}: "
              f"{flips} of {len(order)} answers differ from the request alone; batched pass {seconds:.1f} s")


if __name__ == "__main__":
    main()
