#!/usr/bin/env python3
"""int4 weight error (a measurement, not a test): fastdllm's int4 (models/cpu_int4.py) against
llama.cpp's q4_0 as its format defines it (groups of 32, step = the largest-magnitude weight over
-8, rounded to fp16, codes clamped to [-8, 7]) and the asymmetric min-max groups of 64 fastdllm
used before (bf16 scale and zero). Relative RMS error of the weight, three kinds of random weights.

    python benchmarks/int4_accuracy.py
"""

from __future__ import annotations

import torch

from fastdllm.models.cpu_int4 import dequantize_int4, quantize_int4


def q4_0(w: torch.Tensor) -> torch.Tensor:
    N, K = w.shape
    g = w.view(N, K // 32, 32)
    extreme = g.gather(-1, g.abs().argmax(-1, keepdim=True))
    step = (extreme / -8).half().float()
    return ((g / torch.where(step != 0, step, 1)).round().clamp(-8, 7) * step).view(N, K)


def min_max_64(w: torch.Tensor) -> torch.Tensor:
    N, K = w.shape
    g = w.view(N, K // 64, 64)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    step = ((hi - lo) / 15).clamp_min(1e-12).bfloat16().float()
    zero = (lo + 8 * step).bfloat16().float()
    return (((g - zero) / step + 8).round().clamp(0, 15) - 8).mul(step).add(zero).view(N, K)


def weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    N, K = 1024, 896
    varied = torch.exp(torch.randn(N, K // 32, 1)).expand(N, K // 32, 32).reshape(N, K)
    return {"Gaussian": torch.randn(N, K) * 0.02,
            "Student-t 3": torch.distributions.StudentT(3.0).sample((N, K)) * 0.02,
            "groups of varied scale": torch.randn(N, K) * 0.02 * varied}


def main() -> None:
    formats = {"fastdllm int4": lambda w: dequantize_int4(*quantize_int4(w)), "q4_0": q4_0,
               "min-max g64 (before)": min_max_64}
    print(f"{'weights':24s} " + " ".join(f"{name:>20s}" for name in formats))
    for kind, w in weights().items():
        errs = [((f(w) - w).norm() / w.norm()).item() for f in formats.values()]
        print(f"{kind:24s} " + " ".join(f"{100 * e:19.2f}%" for e in errs))


if __name__ == "__main__":
    main()
