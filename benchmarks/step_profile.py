#!/usr/bin/env python3
"""A decode step's own cost: the forward against everything else the step does (a benchmark, not a test).

    python benchmarks/step_profile.py                            # both shapes, bf16 and fp32, every cache mode
    python benchmarks/step_profile.py --shapes 0.5b --dtypes bf16 --modes dual --reps 5
    python benchmarks/step_profile.py --shapes 0.5b --quantize int8,int4 --modes dual   # + weight-only int8/int4

Real decode steps through the engine (fixed rule, one token per step, greedy, prob confidence) on
random models built in memory (harness.build). The engine's forward is wrapped in a
clock; "rest" is the step's wall time minus its forward: confidence, selection, commits, the
candidates' gather, the host transfer and the block loop's own work; "predict" is the part of the
rest spent in predict (confidences and tokens over the vocabulary). The repetitions of the
variants (dtypes, --quantize) and modes are interleaved (bf16 fp32 bf16 fp32 ...; every variant is held
in memory at once); the table gives medians per step and the
spread (min-max) of the rest's share over the repetitions.
"""

from __future__ import annotations

import time

import harness

from fastdllm.decode import selection, step
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import stepper
from fastdllm.decode.events import StepEvent

SHAPES = ("mid", "0.5b")           # harness.SHAPES


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
    step.predict = predict = Clock(selection.predict)   # the step's own name for it
    try:
        steps, start = 0, time.perf_counter()
        for event in batch.events():
            steps += isinstance(event, StepEvent)
        total = time.perf_counter() - start
    finally:
        step.predict = selection.predict
    return {"step": 1000 * total / steps, "fwd": 1000 * forward.seconds / steps,
            "predict": 1000 * predict.seconds / steps}


def profile_shape(models: dict, args, label: str) -> list[dict]:
    """`models`: variant name -> LoadedModel; the variants' and modes' repetitions are interleaved
    (A B C A B C); the table's lines, returned as records."""
    prompt = harness.prompt_ids(args.prompt)
    config = lambda mode, n: DecodeConfig(gen_len=n, block_len=args.block_len, cache=mode,   # noqa: E731
                                          rule="fixed", early_stop=False)
    modes = harness.csv(args.modes)
    for lm in models.values():
        for mode in modes:                                              # warm-up: one block
            timed_run(lm, prompt, config(mode, args.block_len))
    runs = harness.interleaved({(v, mode): lambda lm=lm, mode=mode: timed_run(lm, prompt, config(mode, args.gen_len))
                                for mode in modes for v, lm in models.items()}, args.reps, warmup=0)
    records = []
    for mode in modes:
        for v in models:
            r = runs[v, mode]
            median = {key: harness.spread([x[key] for x in r])["median"] for key in ("step", "fwd", "predict")}
            share = harness.spread([(x["step"] - x["fwd"]) / x["step"] for x in r])
            print(f"{label:5s} {v:5s} {mode:7s} {median['step']:9.2f} {median['fwd']:9.2f} "
                  f"{median['step'] - median['fwd']:8.2f} {median['predict']:8.2f} {100 * share['median']:6.1f}%   "
                  f"{100 * share['min']:5.1f}-{100 * share['max']:5.1f}%", flush=True)
            records.append(dict(shape=label, model=v, cache=mode, step_ms=median["step"], forward_ms=median["fwd"],
                                predict_ms=median["predict"], rest_share=share, reps=r))
    return records


def main() -> None:
    ap = harness.parser(__doc__, reps=3)
    ap.add_argument("--shapes", default="mid,0.5b", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--quantize", default="", help="also int8 and/or int4 (bf16 activations), e.g. int8,int4")
    ap.add_argument("--modes", default="none,prefix,dual")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--block-len", type=int, default=32)
    args = harness.parse(ap)
    print(f"# {harness.machine('cpu')}")
    print(f"# prompt {args.prompt} tokens, gen_len {args.gen_len}, block {args.block_len}; fixed rule, one token "
          f"per step, greedy, prob confidence; {args.reps} repetitions per mode, interleaved; ms per step (medians)")
    records = []
    for name in harness.csv(args.shapes):
        variants = [(d, d, "none") for d in harness.csv(args.dtypes)] + [(q, "bf16", q) for q in harness.csv(args.quantize)]
        # every variant held at once: their repetitions interleave
        models = {v: harness.build(name, dtype, "cpu", quantize) for v, dtype, quantize in variants}
        sizes = ", ".join(f"{v} {lm.info['weights_bytes'] / 2**20:.0f} MiB" for v, lm in models.items())
        print(f"# {name}: {harness.SHAPES[name].text}; weights {sizes}")
        print(f"{'shape':5s} {'model':5s} {'cache':7s} {'step ms':>9s} {'fwd ms':>9s} {'rest ms':>8s} "
              f"{'predict':>8s} {'rest':>7s}   spread", flush=True)
        records += profile_shape(models, args, name)
        del models
    harness.write_json(args, records, prompt=args.prompt, gen_len=args.gen_len, block_len=args.block_len)


if __name__ == "__main__":
    main()
