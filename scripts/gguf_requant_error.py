"""How far fastdllm's int4 and int8 kernels' weights are from a GGUF tensor's own values (docs/specs/gguf.md 11).

For each GGUF type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 by the gguf package's quantizer, which is llama.cpp's
reference quantizer of those types; Q4_K, Q5_K, Q6_K by checkpoints/gguf_kquants.py)
and two kinds of weights (normal, and Student-t with 4 degrees of freedom: heavy tails), prints the
relative RMS error of: the GGUF type against the original weights; fastdllm's int4 (quantize_int4) and
int8 (quantize_int8, bf16 scales) of the gguf package's dequantization against that dequantization;
and the rows int4 holds exactly. Reference row: int4 / int8 made from the original weights.

    OMP_NUM_THREADS=1 python scripts/gguf_requant_error.py [--rows 896 --cols 4864]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from fastdllm.checkpoints.gguf_kquants import quantize_kquant
from fastdllm.models.cpu_int4 import dequantize_int4, quantize_int4
from fastdllm.models.cpu_quant import quantize_int8


def gguf_round_trip(w: np.ndarray, qtype: str) -> np.ndarray:
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    raw = quantize_kquant(w, qtype) if qtype.endswith("_K") else gguf.quants.quantize(w, kind)
    return gguf.quants.dequantize(raw, kind)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def int4_of(w: torch.Tensor) -> torch.Tensor:
    return dequantize_int4(*quantize_int4(w))


def int8_of(w: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_int8(w, torch.bfloat16)
    return q.float() * scale.float()[:, None]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=896)
    parser.add_argument("--cols", type=int, default=4864)          # a multiple of 256 (k-quant super-blocks)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    weights = {"normal": rng.standard_normal((args.rows, args.cols)),
               "student-t(4)": rng.standard_t(4, (args.rows, args.cols))}
    print(f"{args.rows} x {args.cols}, std 0.02; relative rms error")
    print(f"{'weights':<13} {'type':<9} {'type vs orig':>12} {'int4 vs type':>12} {'int8 vs type':>12} {'exact int4 rows':>16}")
    for kind, w in weights.items():
        w = (w * 0.02).astype(np.float32)
        orig = torch.from_numpy(w)
        print(f"{kind:<13} {'(none)':<9} {'':>12} {rel(int4_of(orig), orig):>12.2%} {rel(int8_of(orig), orig):>12.2%}")
        for qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0"):
            deq = torch.from_numpy(gguf_round_trip(w, qtype))
            four = int4_of(deq)
            exact = int((four == deq).all(1).sum())
            print(f"{kind:<13} {qtype:<9} {rel(deq, orig):>12.2%} {rel(four, deq):>12.2%} "
                  f"{rel(int8_of(deq), deq):>12.2%} {exact:>9} of {args.rows}")


if __name__ == "__main__":
    main()
