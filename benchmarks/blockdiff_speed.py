#!/usr/bin/env python3
"""Block-diffusion decoding cost on random models of the published shapes (a benchmark, not a test).

    python benchmarks/blockdiff_speed.py                          # CPU, fp32: SDAR-1.7B and v2-1.5B shapes
    python benchmarks/blockdiff_speed.py --device cuda --dtype bf16 --shapes sdar-8b,v2-7b --graphs off,on

For each shape: ms per forward and tokens per forward of the family's own profile rule and of one
token per step, and, at the same hidden size and answer length, a bidirectional LLaDA-style model
decoded with DualCache (one token per step, blocks of 32): the cost per generated token of the two
ways of caching. Weights are random (std 0.02), built on the device: confidences, hence tokens per
forward of the threshold rules, say little about a trained model; per-forward costs are the point.
"""

from __future__ import annotations

import os

import harness
from harness import SHAPES, Shape

from fastdllm.decode.config import DecodeConfig

PROFILES = {"sdar": dict(block_len=4, rule="dynamic", threshold=0.95, cache="prefix"),
            "v2": dict(block_len=32, sub_block_len=8, rule="dynamic", threshold=0.9, cache="prefix")}


def llada_twin(shape: Shape) -> Shape:
    """The same hidden size, layers and heads, bidirectional (LLaDA), the shape's vocabulary."""
    c = shape.config
    return Shape(f"LLaDA-style twin of {shape.text}", "llada",
                 dict(d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                      n_kv_heads=c["num_key_value_heads"], mlp_hidden_size=c["intermediate_size"]),
                 dict(vocab_size=c.get("vocab_size", 151936)))


def report(label: str, seconds: float, result, gen_len: int) -> dict:
    print(f"  {label:34s} NFE {result.nfe:4d}  {1000 * seconds / result.nfe:8.1f} ms/forward  "
          f"{result.committed / result.nfe:5.2f} tok/forward  {1000 * seconds / gen_len:8.1f} ms per token  "
          f"{seconds:7.2f} s", flush=True)
    return dict(label=label, nfe=result.nfe, seconds=seconds, ms_per_forward=1000 * seconds / result.nfe,
                tokens_per_forward=result.committed / result.nfe)


def main() -> None:
    ap = harness.parser(__doc__, reps=None, device="cpu", dtype="fp32")
    ap.add_argument("--shapes", default="sdar-1.7b,v2-1.5b", help=f"of {', '.join(n for n in SHAPES if n[0] in 'sv')}")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--graphs", default="on", help="CUDA graphs: on, off, or off,on (FASTDLLM_CUDA_GRAPHS)")
    args = harness.parse(ap)
    cuda = args.device.startswith("cuda")
    print(f"# {args.dtype} on {harness.machine(args.device, args.dtype)}; prompt {args.prompt}, gen_len {args.gen_len}, "
          f"no early stop, random weights")
    prompt = harness.prompt_ids(args.prompt, 1000, 30000)
    records = []
    for name in harness.csv(args.shapes):
        shape = SHAPES[name]
        lm = harness.build(shape, args.dtype, args.device)
        print(f"{name}: {lm.info['parameters'] / 1e9:.2f} B parameters, attention {lm.info['attention']}")
        for graphs in harness.csv(args.graphs) if cuda else ["off"]:
            os.environ["FASTDLLM_CUDA_GRAPHS"] = "1" if graphs == "on" else "0"
            suffix = f", graphs {graphs}" if cuda else ""
            own = DecodeConfig(gen_len=args.gen_len, early_stop=False, **PROFILES[shape.family])
            one = DecodeConfig.from_dict({"rule": "fixed", "threshold": 0.9}, own)
            for label, cfg in ((f"{shape.family} profile rule{suffix}", own), (f"one token per step{suffix}", one)):
                records.append(dict(shape=name, **report(label, *harness.decode(lm, [prompt], cfg), args.gen_len)))
        del lm
        llada = harness.build(llada_twin(shape), args.dtype, args.device)
        dual = DecodeConfig(gen_len=args.gen_len, block_len=32, cache="dual", rule="fixed", early_stop=False)
        records.append(dict(shape=name, **report("LLaDA-style DualCache, 1/step", *harness.decode(llada, [prompt], dual), args.gen_len)))
        del llada
    harness.write_json(args, records, prompt=args.prompt, gen_len=args.gen_len)


if __name__ == "__main__":
    main()
