"""What a DiffusionGemma decoder step costs at the published shape (google/diffusiongemma-26B-A4B-it),
on this machine: a model with one sliding and one full-attention layer is built with random weights
(the 26B checkpoint cannot be downloaded here, and 30 layers would not fit), each part is timed, and
the 30 layers are added up (25 sliding, 5 full). Prints the step, the canvas (steps x step, plus the
encoder pass that commits it), the cost per committed token and the memory at bf16/8-bit/4-bit; on a GPU also the bound set by
reading every weight once per step (all 128 experts are hit by a 256-token canvas).

    python benchmarks/diffusion_gemma_cost.py                       # this CPU, bf16
    python benchmarks/diffusion_gemma_cost.py --device cuda --repeat 20

Timings are medians of --repeat runs after one warm-up, the device synchronised around each part.
"""

from __future__ import annotations

import statistics

import harness
import torch

from fastdllm.checkpoints.info import memory_estimate, shape_summary
from fastdllm.testing.tiny_gemma import PUBLISHED_TEXT
from fastdllm.models.diffusion_gemma import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
)

LAYERS = {"sliding_attention": 25, "full_attention": 5}          # the published 30 layers (5:1)


def main() -> None:
    p = harness.parser(__doc__, reps=None, device="cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--steps", type=int, nargs="+", default=[48, 16], help="denoising steps per canvas to report")
    p.add_argument("--reps", "--repeat", dest="repeat", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--bandwidth", type=float, help="GB/s of device memory, for the weight-read bound")
    args = harness.parse(p)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = DiffusionGemmaConfig(text_config=dict(PUBLISHED_TEXT, num_hidden_layers=2, layer_types=list(LAYERS)),
                                  canvas_length=args.canvas)
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion(config).to(dtype).eval()
    harness.randomize(model, fill_rest=True)                         # scales 1 (no biases)
    prompt = torch.randint(0, PUBLISHED_TEXT["vocab_size"], (1, args.prompt), device=device)
    canvas = torch.randint(0, PUBLISHED_TEXT["vocab_size"], (1, args.canvas), device=device)
    times: dict[str, list[float]] = {}
    hooks = _time_layers(model, times, device)
    with torch.inference_mode():
        for run in range(args.repeat + 1):
            cache = model.new_cache(torch.ones(1, args.prompt + args.canvas, dtype=torch.bool, device=device))
            model.encode(prompt, 0, cache)
            previous = None
            for _ in range(2):                       # a first step, and one self-conditioned on it
                times.setdefault("step", [])
                begin = harness.clock(device)
                logits = model.denoise(canvas, args.prompt, cache, previous)
                times["step"].append(harness.clock(device) - begin)
                previous = logits.to(dtype)
            begin = harness.clock(device)
            model.encode(canvas, args.prompt, cache)
            times.setdefault("encode canvas", []).append(harness.clock(device) - begin)
            if run == 0:
                for measured in times.values():      # the warm-up is not counted
                    measured.clear()
    for h in hooks:
        h.remove()
    report(args, config, model, times, device)


def _time_layers(model, times, device):
    """Forward hooks that time each layer of each kind (decoder steps and encoder passes alike)."""
    hooks, started = [], {}
    for i, layer in enumerate(model.blocks):
        kind = model.config.layer_types[i]
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: started.__setitem__(i, harness.clock(device))))
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, i=i, kind=kind: times.setdefault(kind, []).append(harness.clock(device) - started[i])))
    return hooks


def report(args, config, model, times, device) -> None:
    # per run each layer runs 4 times: the prompt's encoder pass, 2 decoder steps, the canvas's pass
    med = {k: statistics.median(v) for k, v in times.items()}
    layer_step = {k: statistics.median(times[k][1::4] + times[k][2::4]) for k in LAYERS}
    rest = med["step"] - sum(layer_step.values())                # embedding, self-conditioning, norm, head
    step = rest + sum(n * layer_step[k] for k, n in LAYERS.items())
    encode = med["encode canvas"] / 2 * sum(LAYERS.values())    # the built model has 2 layers
    params = sum(p.numel() for p in model.parameters())
    per_layer = {k: sum(p.numel() for p in model.blocks[list(LAYERS).index(k)].parameters()) for k in LAYERS}
    full_params = params - sum(per_layer.values()) + sum(n * per_layer[k] for k, n in LAYERS.items())
    print(f"DiffusionGemma 26B-A4B shape on {harness.machine(device, args.dtype)} ({args.dtype}), prompt {args.prompt}, "
          f"canvas {args.canvas}")
    print(f"  built: 2 layers, {params / 1e9:.2f} B parameters; published depth: {full_params / 1e9:.2f} B")
    print(f"  per decoder step (30 layers added up): {step * 1e3:.0f} ms = {rest * 1e3:.0f} ms embedding + "
          f"self-conditioning + head, {layer_step['sliding_attention'] * 1e3:.0f} ms per sliding layer x 25, "
          f"{layer_step['full_attention'] * 1e3:.0f} ms per full layer x 5")
    print(f"  encoder pass committing a canvas: {encode * 1e3:.0f} ms")
    for n in args.steps:
        canvas_s = n * step + encode
        print(f"  {n} steps per canvas: {canvas_s:.2f} s per canvas, {canvas_s / args.canvas * 1e3:.1f} ms per "
              f"committed token, {args.canvas / canvas_s:.1f} tokens/s")
    if args.bandwidth:
        bound = full_params * model.embed.weight.element_size() / (args.bandwidth * 1e9)
        print(f"  weight-read bound per step at {args.bandwidth:g} GB/s: {bound * 1e3:.1f} ms "
              f"(step / bound = {step / bound:.1f}x)")
    print("  CUDA graphs: not used for this family (its expert routing sizes matmuls on the host)")
    memory(args)
    harness.write_json(args, [dict(step_ms=1e3 * step, rest_ms=1e3 * rest, encode_ms=1e3 * encode,
                                   layer_ms={k: 1e3 * v for k, v in layer_step.items()}, parameters=full_params)],
                       prompt=args.prompt, canvas=args.canvas, repeat=args.repeat)


def memory(args) -> None:
    """`fastdllm info`'s estimate at the published shape (30 layers built on the meta device)."""
    config = DiffusionGemmaConfig(text_config=PUBLISHED_TEXT, canvas_length=args.canvas)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in DiffusionGemmaForBlockDiffusion(config).state_dict().items()}
    tokens = args.prompt + args.canvas
    for precision, est in memory_estimate(shape_summary(shapes, config), tokens).items():
        print(f"  memory {precision}: {est['total'] / 2**30:.1f} GiB (weights {est['weights'] / 2**30:.1f} GiB "
              f"+ cache {est['cache'] / 2**20:.0f} MiB for {tokens} tokens)")


if __name__ == "__main__":
    main()
