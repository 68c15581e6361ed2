#!/usr/bin/env python3
"""What fusing a block's elementwise work would give a cached step: a benchmark of a candidate
change, not of the engine as shipped (a benchmark, not a test).

    python benchmarks/fused_elementwise.py --d-model 4096 --layers 32 --heads 32 --mlp 12288 \
        --vocab 126464 --prompt 512 --device cuda --in-memory --batch 1,8    # the 8B shape on a GPU

A graphed DualCache step of the 8B shape on an H200 spends about a quarter of its time in
elementwise kernels, each launched once per layer (RMSNorm's casts and scale, the rotary, SiLU
times up; `speed.py --kernels`). This script times the step as the engine runs it, then with those
three pieces compiled by torch.compile (inductor, its precision casts emulated so that each bf16
rounding the eager code makes is kept; `--fp-fusion off`: no multiply-add contracted into an FMA
either), and compares the two greedy generations token by token.
The first compiled run's time is printed as the compilation's. The pieces are swapped in for that
run and restored after: the engine does not use them.
"""

from __future__ import annotations

import contextlib
import os
import time

import harness
import speed
import torch
import torch.nn.functional as F

from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.models import layers, llada


PIECES = ("rms", "rotary", "silu_times")


@contextlib.contextmanager
def fused_elementwise(only=PIECES):
    """RMSNorm, apply_rotary and SwiGLU's SiLU * up (those named in `only`) compiled (shapes static:
    one compilation per span shape) in place of the eager ones, for the `with` block."""
    torch._inductor.config.emulate_precision_casts = True
    torch._dynamo.config.recompile_limit = 64      # one compilation per shape (eager spans vary on a CPU)

    @torch.compile(dynamic=False)
    def rms(x, weight, eps: float):
        return weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps).to(x.dtype)

    @torch.compile(dynamic=False)
    def silu_times(gate, up):
        return F.silu(gate) * up

    def swiglu(x, gate, up, down):
        g, u = layers.project(x, gate, up)
        return layers.linear(silu_times(g, u), down)

    saved = layers.RMSNorm.forward, layers.apply_rotary, layers.swiglu, llada.swiglu
    rotary = torch.compile(saved[1], dynamic=False)
    if "rms" in only:
        layers.RMSNorm.forward = lambda self, x: rms(x, self.weight, self.eps)
    if "rotary" in only:
        layers.apply_rotary = rotary
    if "silu_times" in only:
        layers.swiglu = llada.swiglu = swiglu
    try:
        yield {"rms": (lambda x, w: saved[0](_Norm(w), x), lambda x, w: rms(x, w, 1e-5)),
               "rotary": (saved[1], rotary), "silu_times": (lambda g, u: F.silu(g) * u, silu_times)}
    finally:
        layers.RMSNorm.forward, layers.apply_rotary, layers.swiglu, llada.swiglu = saved


class _Norm:
    """What RMSNorm.forward reads of its module."""
    def __init__(self, weight):
        self.weight, self.eps = weight, 1e-5


def pieces_equal(pieces: dict, rows: int, d: int, heads: int, mlp: int, dtype, device) -> str:
    """Each piece eager and compiled on the same random inputs of a step's shapes: how many of its
    outputs differ in any bit."""
    g = torch.Generator(device="cpu").manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device=device, dtype=dtype)     # noqa: E731
    cos, sin = layers.rotary_tables(torch.arange(rows, device=device)[None] + 500, d // heads, 10000.0, dtype)
    inputs = {"rms": (rand(1, rows, d), rand(d)), "rotary": (rand(1, rows, 2 * heads, d // heads), cos, sin),
              "silu_times": (rand(1, rows, mlp), rand(1, rows, mlp))}
    return ", ".join(f"{name} {(eager(*inputs[name]) != fused(*inputs[name])).sum().item()} of "
                     f"{eager(*inputs[name]).numel()}" for name, (eager, fused) in pieces.items())


def main() -> None:
    ap = harness.parser(__doc__, reps=None, device="cuda", dtype="bf16")
    harness.add_llada_shape(ap)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--batch", default="1", help="rows per batch, e.g. 1,8 (distinct random prompts)")
    ap.add_argument("--in-memory", action="store_true", help="build the weights on the device, no checkpoint on disk")
    ap.add_argument("--bandwidth", type=float, default=None, help="memory bytes/s for the weight-read bound")
    ap.add_argument("--fp-fusion", choices=("on", "off"), default="on",
                    help="off: Triton compiles without contracting a multiply and an add into one FMA "
                         "(TRITON_DEFAULT_FP_FUSION=0), as the eager kernels, one operation each, round")
    args = harness.parse(ap)
    if args.fp_fusion == "off":
        os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"
    if args.dtype == "fp64":
        raise SystemExit("float64 runs the eager pieces anyway: give bf16 or fp32")
    os.environ.setdefault("FASTDLLM_CUDA_GRAPHS", "1")
    shape = harness.llada_shape(args)
    lm = harness.build(shape, args.dtype, args.device)
    print(f"# model: {shape.text}; {args.dtype} on {harness.machine(lm.device, args.dtype)}")
    print(f"# prompt {args.prompt} tokens, gen_len {args.gen_len}, block {args.block_len}, DualCache, one token per step")
    bound_ms = speed.weight_read_bound(lm, args)
    cfg = DecodeConfig(gen_len=args.gen_len, block_len=args.block_len, cache="dual", rule="fixed", early_stop=False)
    records = []
    for batch in harness.csv(args.batch, int):
        prompts = [harness.prompt_ids(args.prompt, high=min(args.vocab, 300), seed=row) for row in range(batch)]
        eager = speed.speed_line(lm, prompts, cfg, f"batch {batch:2d}  eager elementwise", bound_ms)
        eager_ids = run(lm.decoder, prompts, cfg).canvas
        control = (run(lm.decoder, prompts, cfg).canvas == eager_ids).float().mean().item()   # eager against itself
        with fused_elementwise() as pieces:
            print(f"batch {batch:2d}  outputs differing, eager against compiled: "
                  + pieces_equal(pieces, batch * args.block_len, args.d_model, args.heads, args.mlp, lm.dtype, lm.device))
            start = harness.clock(lm.device)
            run(lm.decoder, prompts, DecodeConfig.from_dict({"gen_len": args.block_len * 2}, cfg))
            compile_s = harness.clock(lm.device) - start
            fused = speed.speed_line(lm, prompts, cfg, f"batch {batch:2d}  fused elementwise", bound_ms)
            fused_ids = run(lm.decoder, prompts, cfg).canvas
        same = (eager_ids == fused_ids).float().mean().item()
        after = (run(lm.decoder, prompts, cfg).canvas == eager_ids).float().mean().item()
        alone = {}
        for piece in PIECES:                   # which piece, swapped in alone, changes the tokens
            with fused_elementwise(only=(piece,)):
                alone[piece] = (run(lm.decoder, prompts, cfg).canvas == eager_ids).float().mean().item()
        print(f"batch {batch:2d}  tokens equal to eager's: eager again after compiling {after:.1%}; one piece "
              "compiled: " + ", ".join(f"{k} {v:.1%}" for k, v in alone.items()), flush=True)
        print(f"batch {batch:2d}  first fused run (compilation) {compile_s:.1f} s; cached step "
              f"{eager['cached_step_ms']['median']:.2f} -> {fused['cached_step_ms']['median']:.2f} ms; "
              f"tokens equal {same:.1%} of {eager_ids.numel()} (eager run twice: {control:.1%})", flush=True)
        records.append(dict(batch=batch, eager=eager, fused=fused, compile_s=compile_s, tokens_equal=same,
                            tokens_equal_eager_twice=control, tokens_equal_eager_after=after,
                            tokens_equal_one_piece=alone))
    harness.write_json(args, records, model=shape.text, prompt=args.prompt, gen_len=args.gen_len,
                       weight_read_bound_ms=bound_ms)


if __name__ == "__main__":
    main()
