#!/usr/bin/env python3
"""Mixture-of-experts decoding cost against a dense model of the same active size, and the memory
of the full MoE checkpoints (a benchmark, not a test; issue 14).

    python benchmarks/moe_speed.py                                    # CPU, fp32: LLaDA2-mini per layer, 2 layers
    python benchmarks/moe_speed.py --shapes llada2-mini,llada-moe-7b --threads 1 --engine
    python benchmarks/moe_speed.py --device cuda --dtype bf16 --shapes llada2-mini,llada-moe-7b   # all layers
    python benchmarks/moe_speed.py --shapes sdar-30b-a3b --block 4 --masked 0.75   # SDAR's blocks of 4
    python benchmarks/moe_speed.py --shapes rnd1-30b-a3b --prefix 64 --gen-len 256   # RND1: the whole canvas, no cache

1. Per-step cost. The published config (fastdllm/checkpoints/published/<family>/config.json) with only
   `--layers` (every one a MoE layer: the published dense layer 0 is left out, so the figures are
   per MoE layer) and `--experts` changed, built in memory with random weights (std 0.02), against
   a dense model of the same class, layers and attention whose MLP width is the active expert width
   (LLaDA2-mini: 8 x 512 + 1 shared x 512 = 4608; LLaDA-MoE: 8 x 1024 = 8192; SDAR-30B-A3B: 8 x 768
   = 6144, no shared expert), so that both have the same parameters per token. A step is what
   decoding runs inside a block: `forward_span` over one block of `--block` tokens (half of them
   masks by default) against a cache holding `--prefix` tokens before it, logits at the block's
   masked positions; block-causal for LLaDA2 and SDAR-30B-A3B (their prefix-cache step; SDAR's
   blocks are 4 tokens: `--block 4`), bidirectional against the whole canvas for LLaDA-MoE (its DualCache step).
   RND1 decodes one global canvas without a cache: its step is a forward over the whole canvas
   (`--prefix` prompt tokens and `--gen-len` answer slots, a `--masked` share of them masks), and so
   is its dense twin's (benchmarks/moe_step.py). Fewer experts
   change nothing in the compute of one token, but they change how many distinct experts the
   block's tokens hit, and every expert hit is read once per step: that count (measured, and the
   expectation under uniform routing) is printed beside the cost. The MoE model is timed twice:
   with its random router (std 0.02 weights barely change a token's hidden state, so the block's
   masks, one embedding row, all route alike: a low spread) and with k experts drawn uniformly per
   token (the spread of a router that balances load within the block). A trained router lies
   somewhere between; the two rows bracket the cost.
2. The weights each step reads (the experts hit, the shared expert, attention, router, head; not
   the embedding, of which only the block's rows are read) against the read bandwidth: the
   weight-read bound (measured with one pass over a 1 GiB buffer unless `--bandwidth` is given).
   Also an estimate of the published full-depth step from the per-layer times.
3. Memory of the full published shapes at bf16 / 8-bit / 4-bit, from parameter counts as
   `fastdllm info` computes them (checkpoints/info.py; the model is built on the meta device: no
   weights), against 24 GiB and 12 GiB GPUs.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import harness
import torch
from moe_memory import (  # benchmarks/moe_memory.py: the memory table (part 3)
    add_memory_args,
    memory,
)
from moe_shapes import (  # benchmarks/moe_shapes.py
    SHAPES,
    active_parameters,
    active_width,
    dense_config,
    dense_layers,
    expected_hits,
    expert_width,
    moe_config,
    published,
    random_model,
    read_per_step,
    shared_width,
)
from moe_step import (  # benchmarks/moe_step.py: the timed step
    WHOLE_CANVAS,
    Step,
    uniform_routing,
)

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.family_defaults import decode_defaults


def engine_ms(lm, args) -> tuple[float, int, float]:
    """ms per forward, NFE and tokens per forward of the family's own decoding rule (engine.run,
    no early stop) on a prompt of `--prefix` tokens; one block of warm-up not counted."""
    cfg = DecodeConfig(**{**decode_defaults(lm.model.config.to_dict()), "gen_len": args.engine_gen_len,
                          "early_stop": False})
    prompt = harness.prompt_ids(args.prefix, 0, 4096)
    seconds, result = harness.decode(lm, [prompt], cfg, warmup_blocks=1)
    return 1000 * seconds / result.nfe, result.nfe, result.committed / result.nfe


# --- the three parts -------------------------------------------------------------------------------
def speed(name: str, args, tmp: Path, bandwidth: float) -> list[dict]:
    raw = published(name)
    layers = args.layers or raw["num_hidden_layers"]
    experts = args.experts or raw["num_experts"]
    k = raw["num_experts_per_tok"]
    device = torch.device(args.device)
    tiny = loading.load(SHAPES[name][1](tmp / name, num_hidden_layers=1), dtype=args.dtype, device=args.device)
    rows = []
    for kind, config in (("MoE", moe_config(raw, layers, experts)), ("dense", dense_config(raw, layers))):
        start = time.perf_counter()
        lm = random_model(tiny, config, device)
        built = time.perf_counter() - start
        step = Step(lm, args)
        routings = args.routing.split(",") if kind == "MoE" else ["-"]
        for routing in routings:
            with uniform_routing(lm.model) if routing == "uniform" else nullcontext():
                hits = step.expert_hits()
                ms, layer_ms = step.timed(args.reps)
                row = dict(label=kind if routing == "-" else f"{kind}, {routing}", kind=kind, ms=ms, layer_ms=layer_ms,
                           hits=hits, params=lm.info["parameters"], active=active_parameters(lm.model),
                           read=read_per_step(lm.model, hits if kind == "MoE" else None))
                if args.engine:
                    row["engine"] = engine_ms(lm, args)
            rows.append(row)
            print(f"{name} {row['label']}: built in {built:.0f} s, {ms:.1f} ms/step", file=sys.stderr, flush=True)
        if kind == "MoE":   # the dense twin of RND1 is an sdar_moe class: name the MoE model's attention
            attention, K, rows_routed, what = lm.info["attention"], step.positions.shape[1], step.tokens(), step.describe(args)
        del lm, step
        tiny.model = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dense, width = rows[-1], active_width(raw)
    print(f"\n### {name}: {layers} MoE layers of {experts} experts x {expert_width(raw)} (k = {k}"
          f"{f', shared {shared_width(raw)}' if shared_width(raw) else ''}) against {layers} dense layers x {width}\n")
    print(f"hidden {raw['hidden_size']}, {raw['num_attention_heads']} heads / {raw['num_key_value_heads']} KV heads, "
          f"vocab {raw['vocab_size']}, {attention} attention. Step: {what}; "
          f"median of {args.reps} steps after a warm-up. Experts hit: distinct experts per layer, chosen by the "
          f"step's {rows_routed} tokens (in the last layer by the {K} rows whose logits are asked for; "
          f"uniform routing expects {expected_hits(experts, k, rows_routed):.0f} and "
          f"{expected_hits(experts, k, K):.0f}). `router`: the random router (std 0.02: a block's masks, one "
          f"embedding row, route alike); `uniform`: k experts drawn uniformly per token.\n")
    head = ("| model | parameters built (active / token) | experts hit per layer (of E) | ms / step | "
            "ms per layer | head and rest ms | weights read / step | x read bound |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for r in rows:
        hits = f"{', '.join(map(str, r['hits']))} (of {experts})" if r["kind"] == "MoE" else f"- (MLP {width})"
        bound = 1000 * r["read"] / bandwidth
        print(f"| {r['label']} | {r['params'] / 1e9:.2f} B ({r['active'] / 1e9:.2f} B) | {hits} | {r['ms']:.1f} | "
              f"{', '.join(f'{t:.1f}' for t in r['layer_ms'])} | {r['ms'] - sum(r['layer_ms']):.1f} | "
              f"{r['read'] / 2**30:.2f} GiB | {r['ms'] / bound:.1f} |")
    print()
    for r in rows[:-1]:
        per_layer = ", ".join(f"{m / d:.2f}x" for m, d in zip(r["layer_ms"], dense["layer_ms"]))
        print(f"- {r['label']} / dense: **{r['ms'] / dense['ms']:.2f}x per step** ({layers} layers and the head), "
              f"per layer {per_layer}; weights read per step {r['read'] / dense['read']:.2f}x")
        full_estimate(raw, r, dense, experts, layers)
    if args.engine:
        for r in rows:
            ms, nfe, tpf = r["engine"]
            print(f"- engine, the family's rule ({args.engine_gen_len} tokens, prompt {args.prefix}): "
                  f"{r['label']} {ms:.1f} ms/forward, NFE {nfe}, {tpf:.2f} tokens/forward")
    return [dict(shape=name, layers=layers, experts=experts, **r) for r in rows]


def full_estimate(raw: dict, moe: dict, dense: dict, experts: int, layers: int) -> None:
    """The published depth from the measured parts: head and rest, the dense layers, the MoE layers
    (all but the last as the measured full-span layers, the last as the measured last layer)."""
    if layers < 2:
        print("  - published depth: not estimated (needs --layers 2 or more: a full-span layer and the last)")
        return
    L = raw["num_hidden_layers"]
    n_dense = dense_layers(raw)
    moe_full, dense_full = (statistics.median(r["layer_ms"][:-1]) for r in (moe, dense))
    est_moe = moe["ms"] - sum(moe["layer_ms"]) + n_dense * dense_full + (L - 1 - n_dense) * moe_full + moe["layer_ms"][-1]
    est_dense = dense["ms"] - sum(dense["layer_ms"]) + (L - 1) * dense_full + dense["layer_ms"][-1]
    note = f" (its dense layer{'s' if n_dense > 1 else ''} timed as {active_width(raw)} wide)" if n_dense else ""
    spread = "" if experts == raw["num_experts"] else \
        f"; {experts} experts, not the published {raw['num_experts']}: the published spread (hence cost) is " \
        f"{'larger' if experts < raw['num_experts'] else 'smaller'}"
    hits = statistics.mean(moe["hits"][:-1])
    print(f"  - published depth, {L} layers{note}: estimated {est_moe:.0f} ms/step against dense "
          f"{est_dense:.0f} ms/step, **{est_moe / est_dense:.2f}x** (mean experts hit per full-span layer "
          f"{hits:.0f}){spread}")


def main() -> None:
    ap = harness.parser(__doc__, reps=5, device="cpu", dtype=None)
    ap.add_argument("--shapes", default="llada2-mini", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--layers", type=int, default=None, help="MoE layers built (default: 2 on CPU, the published count on a GPU)")
    ap.add_argument("--experts", type=int, default=None, help="routed experts per layer (default: the published count)")
    ap.add_argument("--prefix", type=int, default=256, help="cached tokens before the block (also the --engine prompt)")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=128, help="canvas slots from the block on")
    ap.add_argument("--masked", type=float, default=0.5, help="fraction of the block's tokens that are masks (at least one)")
    ap.add_argument("--routing", default="router,uniform", help="MoE choices timed: router (the random router's), uniform")
    ap.add_argument("--dtype", default=None, help="fp32 (CPU default) or bf16 (GPU default)")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s for the read bound (default: measured)")
    ap.add_argument("--engine", action="store_true", help="also decode with the engine and the family's rule")
    ap.add_argument("--engine-gen-len", type=int, default=64)
    add_memory_args(ap)
    ap.add_argument("--skip-speed", action="store_true", help="only the memory table")
    args = harness.parse(ap)
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if args.layers is None and device.type == "cpu":
        args.layers = 2
    where = harness.machine(device, args.dtype)              # with the load before this script's own work
    bandwidth = args.bandwidth or harness.read_bandwidth(device)
    conditions = [("device", where), ("dtype", args.dtype),
                  ("read bandwidth", f"{bandwidth / 1e9:.1f} GB/s ({'given' if args.bandwidth else 'measured: one pass over 1 GiB on a GPU, 256 MiB on a CPU'})"),
                  ("shapes", ", ".join(f"{n} ({args.layers or published(n)['num_hidden_layers']} MoE layers, "
                                       f"{args.experts or published(n)['num_experts']} experts)" for n in args.shapes.split(","))),
                  ("step", f"block {args.block}, {args.masked:.0%} masks, {args.prefix} cached tokens, canvas "
                           f"{args.prefix + args.gen_len}, median of {args.reps}; {', '.join(WHOLE_CANVAS)}: the "
                           f"whole canvas, {args.masked:.0%} of its {args.gen_len} answer slots masks, no cache"),
                  ("weights", "random (std 0.02), built in memory")]
    print("# MoE against dense of the same active size (benchmarks/moe_speed.py)\n\n| condition | value |\n|---|---|")
    for key, value in conditions:
        print(f"| {key} | {value} |")
    records = []
    if not args.skip_speed:
        with tempfile.TemporaryDirectory() as tmp:
            for name in harness.csv(args.shapes):
                records += speed(name, args, Path(tmp), bandwidth)
    memory(args)
    harness.write_json(args, records, **dict(conditions))


if __name__ == "__main__":
    main()
