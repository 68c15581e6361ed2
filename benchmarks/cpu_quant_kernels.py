#!/usr/bin/env python3
"""CPU matmul kernels for weight-only quantization against the float linears fastdllm runs (a
benchmark, not a test): fp32 and bf16 nn.Linear weights in oneDNN's packed layout (what
prepare_for_inference leaves on CPU), torch's int8 (`_weight_int8pack_mm`, per-channel scales)
and int4 (`_weight_int4pack_mm_for_cpu` on Int4Linear's packed weight, groups of 32), and int8
weights with int8 activations ("w8a8": Int8Linear.matmul_int8 itself, per-row dynamic activation
quantization + `torch._int_mm` + rescale, the path Int8Linear takes from W8A8_ROWS rows; "w4a8":
Int4Linear.matmul_int8, the same after unpacking the int4 codes to int8).

    python benchmarks/cpu_quant_kernels.py                        # the 0.5B and mid shapes, M 1..320
    python benchmarks/cpu_quant_kernels.py --shapes 0.5b --rows 1,32 --reps 7
    python benchmarks/cpu_quant_kernels.py --shapes 0.5b --no-head --variants "bf16,int8 bf16,w8a8 bf16"

Variants of one (shape, M) are interleaved (A B C A B C ...); the table gives the median ms of the
repetitions and each variant's speed-up over bf16.
"""

from __future__ import annotations

import harness
import torch
from torch import nn

from fastdllm.models.cpu_int4 import GROUP, Int4Linear
from fastdllm.models.cpu_quant import Int8Linear

# name -> [(what, N out, K in)]: the fused q/k/v and gate/up matmuls as the model runs them
SHAPES = {
    "0.5b": [("qkv 896->1152", 1152, 896), ("k/v 896->128 (unfused)", 128, 896), ("o 896->896", 896, 896),
             ("gate/up 896->9728", 9728, 896),
             ("down 4864->896", 896, 4864), ("head 896->151936", 151936, 896)],
    "mid": [("qkv 512->1536", 1536, 512), ("gate/up 512->2816", 2816, 512), ("down 1408->512", 512, 1408),
            ("head 512->32000", 32000, 512)],
}


def variants(N: int, K: int) -> dict:
    """name -> function(x fp32) of a random weight (N, K), std 0.02, in each format."""
    torch.manual_seed(0)
    w = torch.randn(N, K) * 0.02
    out = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dt))
            out[name] = (dt, lambda x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""))
        except RuntimeError:        # no oneDNN bf16 packing without AVX-512 (e.g. ATEN_CPU_CAPABILITY=avx2)
            out[name] = (dt, lambda x, p=w.to(dt): torch.nn.functional.linear(x, p))
    scale = w.abs().amax(1) / 127
    q8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    for name, dt in (("int8 bf16", torch.bfloat16), ("int8 fp32", torch.float32)):
        s = scale.to(dt)
        out[name] = (dt, lambda x, s=s: torch._weight_int8pack_mm(x, q8, s))
    lin = nn.Linear(K, N, bias=False)
    lin.weight.data = w
    w8a8 = Int8Linear(lin, torch.bfloat16)
    out["w8a8 bf16"] = (torch.bfloat16, w8a8.matmul_int8)
    w4 = Int4Linear(lin, torch.bfloat16)
    for name, dt in (("int4 bf16", torch.bfloat16), ("int4 fp32", torch.float32)):
        sz = w4.scales_and_zeros.to(dt)
        out[name] = (dt, lambda x, sz=sz: torch._weight_int4pack_mm_for_cpu(x, w4.weight, GROUP, sz))
    out["w4a8 bf16"] = (torch.bfloat16, w4.matmul_int8)
    return out


# fp32 activations take the kernels' reference loops (10-100x slower than bf16): timed at few rows only
SLOW = ("int8 fp32", "int4 fp32")


def measure(fns: dict, M: int, K: int, reps: int, slow_rows: int) -> dict[str, float]:
    """Median ms of each variant on M rows, the variants interleaved after one warm-up."""
    fns = {name: f for name, f in fns.items() if name not in SLOW or M <= slow_rows}
    x = torch.randn(M, K)
    inputs = {dt: x.to(dt) for dt in (torch.float32, torch.bfloat16)}
    runs = {name: lambda dt=dt, fn=fn: harness.time_ms(lambda: fn(inputs[dt])) for name, (dt, fn) in fns.items()}
    return {name: harness.spread(t)["median"] for name, t in harness.interleaved(runs, reps).items()}


def main() -> None:
    ap = harness.parser(__doc__, reps=9)
    ap.add_argument("--shapes", default="0.5b,mid")
    ap.add_argument("--rows", default="1,8,16,32,64,128,320")
    ap.add_argument("--slow-rows", type=int, default=8, help=f"largest M timed for {', '.join(SLOW)}")
    ap.add_argument("--variants", default="", help="comma-separated columns to time (default: all; bf16 always)")
    ap.add_argument("--no-head", action="store_true", help="leave out the output head's shape (slow)")
    ap.add_argument("--only", default="", help="time only the matrices whose name starts with this (e.g. head)")
    args = harness.parse(ap)
    print(f"# {harness.machine('cpu')}; median ms of {args.reps} interleaved repetitions (x: speed-up over bf16)")
    records = []
    with torch.no_grad():
        for shape in args.shapes.split(","):
            for what, N, K in SHAPES[shape]:
                if (args.no_head and what.startswith("head")) or not what.startswith(args.only):
                    continue
                fns = variants(N, K)
                if args.variants:
                    keep = {"bf16", *args.variants.split(",")}
                    fns = {name: f for name, f in fns.items() if name in keep}
                print(f"## {shape} {what}")
                print(f"{'M':>4s} " + " ".join(f"{name:>16s}" for name in fns))
                for M in map(int, args.rows.split(",")):
                    ms = measure(fns, M, K, args.reps, args.slow_rows)
                    print(f"{M:4d} " + " ".join(f"{ms[n]:8.3f} ({ms['bf16'] / ms[n]:4.2f}x)" if n in ms else f"{'-':>16s}"
                                                for n in fns), flush=True)
                    records.append(dict(shape=shape, matrix=what, rows=M, ms=ms))
    harness.write_json(args, records, reps=args.reps)


if __name__ == "__main__":
    main()
