#!/usr/bin/env python3
"""A decode step's own cost: the forward against everything else the step does (a benchmark, not a test).

    python benchmarks/step_profile.py                            # both shapes, bf16 and fp32, every cache mode
    python benchmarks/step_profile.py --shapes 0.5b --dtypes bf16 --modes dual --reps 5
    python benchmarks/step_profile.py --shapes 0.5b --quantize int8,int4 --modes dual   # + weight-only int8/int4

Real decode steps through the engine (fixed rule, one token per step, greedy, prob confidence) on
random models built in memory (benchmarks/speed.py's builder). The engine's forward is wrapped in a
clock; "rest" is the step's wall time minus its forward: confidence, selection, commits, the
candidates' gather, the host transfer and the block loop's own work; "predict" is the part of the
rest spent in selection.predict (confidences and tokens over the vocabulary). The repetitions of the
variants (dtypes, --quantize) and modes are interleaved (bf16 fp32 bf16 fp32 ...; every variant is held
in memory at once); the table gives medians per step and the
spread (min-max) of the rest's share over the repetitions.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch
from speed import (  # benchmarks/speed.py: random weights of any shape
    build_in_memory,
    in_memory,
)

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.tiny_random import FIXTURES, write_dream
from fastdllm.decode import engine, selection
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import stepper
from fastdllm.decode.events import StepEvent
from fastdllm.models.cpu import bf16_note, capability

MID = dict(d_model=512, layers=8, heads=8, mlp=1408, vocab=32000)
HALF_B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_window_layers=24)


def cpu_name() -> str:
    """The CPU's model name where Linux says it, else the platform's word."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def build_mid(dtype: str, tmp: Path, quantize: str = "none"):
    return build_in_memory(Namespace(**MID, dtype=dtype, device="cpu", fixtures=FIXTURES, quantize=quantize), tmp)


def build_half_b(dtype: str, tmp: Path, quantize: str = "none"):
    """Qwen2.5-0.5B's shape in Dream's layout (2 KV heads, tied head), Dream's real tokenizer."""
    path = write_dream(tmp / "dream", hidden_size=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64)
    return in_memory(loading.load(path, dtype=dtype, device="cpu"), "Dream", HALF_B, quantize)


# name -> (description, builder(dtype, tmp) -> LoadedModel)
SHAPES = {
    "mid": ("random LLaDA d512, 8 layers, 8 heads, MLP 1408, vocab 32000", build_mid),
    "0.5b": ("random Dream d896, 24 layers, 14 heads (2 KV), MLP 4864, vocab 151936, tied head", build_half_b),
}


class Clock:
    """A callable with a clock around each call (CPU: calls are synchronous); other attributes are
    the wrapped object's (the engine's SpanForward)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return out


def timed_run(lm, prompt: list[int], cfg: DecodeConfig) -> dict[str, float]:
    """Milliseconds per step of one generation: the step, its forward, its `predict` (the engine's
    confidence and prediction, a part of the rest); the setup (cache, canvas) is not counted."""
    batch = stepper(lm.decoder, [prompt], cfg)
    batch.forward = forward = Clock(batch.forward)
    engine.predict = predict = Clock(selection.predict)
    try:
        steps, start = 0, time.perf_counter()
        for event in batch.events():
            steps += isinstance(event, StepEvent)
        total = time.perf_counter() - start
    finally:
        engine.predict = selection.predict
    return {"step": 1000 * total / steps, "fwd": 1000 * forward.seconds / steps,
            "predict": 1000 * predict.seconds / steps}


def profile_shape(models: dict, args, label: str) -> None:
    """`models`: variant name -> LoadedModel; the variants' and modes' repetitions are interleaved."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, 300, (args.prompt,), generator=g).tolist()
    config = lambda mode, n: DecodeConfig(gen_len=n, block_len=args.block_len, cache=mode,   # noqa: E731
                                          rule="fixed", early_stop=False)
    modes = args.modes.split(",")
    for lm in models.values():
        for mode in modes:                                              # warm-up
            timed_run(lm, prompt, config(mode, args.block_len))
    runs = {(v, mode): [] for v in models for mode in modes}
    for _ in range(args.reps):                                          # interleaved: A B C A B C
        for mode in modes:
            for v, lm in models.items():
                runs[v, mode].append(timed_run(lm, prompt, config(mode, args.gen_len)))
    for mode in modes:
        for v in models:
            r = runs[v, mode]
            median = {key: statistics.median(x[key] for x in r) for key in ("step", "fwd", "predict")}
            share = [(x["step"] - x["fwd"]) / x["step"] for x in r]
            print(f"{label:5s} {v:5s} {mode:7s} {median['step']:9.2f} {median['fwd']:9.2f} "
                  f"{median['step'] - median['fwd']:8.2f} {median['predict']:8.2f} {100 * statistics.median(share):6.1f}%   "
                  f"{100 * min(share):5.1f}-{100 * max(share):5.1f}%", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="mid,0.5b", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--quantize", default="", help="also int8 and/or int4 (bf16 activations), e.g. int8,int4")
    ap.add_argument("--modes", default="none,prefix,dual")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="timed generations per mode, interleaved")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# CPU {cpu_name()}: torch capability {capability()}, {bf16_note()}; {torch.get_num_threads()} threads; "
          f"torch {torch.__version__}")
    print(f"# prompt {args.prompt} tokens, gen_len {args.gen_len}, block {args.block_len}; fixed rule, one token "
          f"per step, greedy, prob confidence; {args.reps} repetitions per mode, interleaved; ms per step (medians)")
    for name in args.shapes.split(","):
        text, build = SHAPES[name]
        variants = [(d, d, "none") for d in args.dtypes.split(",")] + \
            [(q, "bf16", q) for q in args.quantize.split(",") if q]
        models = {}
        for v, dtype, quantize in variants:                              # all held at once: interleaved
            with tempfile.TemporaryDirectory() as tmp:
                models[v] = build(dtype, Path(tmp), quantize)
        sizes = ", ".join(f"{v} {lm.info['weights_bytes'] / 2**20:.0f} MiB" for v, lm in models.items())
        print(f"# {name}: {text}; weights {sizes}")
        print(f"{'shape':5s} {'model':5s} {'cache':7s} {'step ms':>9s} {'fwd ms':>9s} {'rest ms':>8s} "
              f"{'predict':>8s} {'rest':>7s}   spread", flush=True)
        profile_shape(models, args, name)
        del models


if __name__ == "__main__":
    main()
