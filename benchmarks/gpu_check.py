#!/usr/bin/env python3
"""GPU check of the CUDA-graph path (needs a CUDA device; a check to run by hand, not a CI test).

    python benchmarks/gpu_check.py

Tiny random LLaDA and Dream checkpoints in the published formats, fp32 on the GPU, a batch of two
prompts of different lengths: decoding with graph replay must commit exactly the same tokens at
the same positions at every step as eager decoding with the same (full-block) candidate lists.
Prints one line per case and exits non-zero on any difference.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.testing.tiny_random import FIXTURES, write_dream, write_llada  # noqa: E402
from fastdllm.decode import mask_loop  # noqa: E402
from fastdllm.decode.config import DecodeConfig  # noqa: E402
from fastdllm.decode.engine import Result, StepEvent, generate  # noqa: E402
from fastdllm.decode.graphs import SpanForward  # noqa: E402

PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please."]


def decode(lm, prompts, cfg, graphs: bool):
    made = []

    def factory(cls, model, canvas, cache, widen=True):
        made.append(cls(model, canvas, cache, graphs=graphs, full_block=True, widen=widen))
        return made[-1]

    mask_loop.SpanForward.for_model = classmethod(factory)
    steps, result = [], None
    for e in generate(lm.decoder, prompts, cfg):
        if isinstance(e, StepEvent):
            steps.append((e.block, e.step, e.positions[e.committed].tolist(), e.tokens[e.committed].tolist()))
        elif isinstance(e, Result):
            result = e
    return steps, result, made[0]


def main() -> int:
    assert torch.cuda.is_available(), "needs a CUDA device"
    original = SpanForward.for_model
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        models = {"llada": write_llada(Path(tmp) / "llada", d_model=128, n_layers=3, n_heads=4, mlp_hidden_size=256,
                                       init_std=0.3, logit_scale=2.0, fixtures=FIXTURES),
                  "dream": write_dream(Path(tmp) / "dream", hidden_size=128, n_layers=3, n_heads=4, n_kv_heads=2,
                                       intermediate_size=256, init_std=0.3, logit_scale=4.0, fixtures=FIXTURES)}
        for family, path in models.items():
            lm = loading.load(path, dtype="fp32", device="cuda")
            prompts = [lm.encode(p, chat=True) for p in PROMPTS]
            for cache in ("none", "prefix", "dual"):
                for rule in ("threshold", "fixed"):
                    cfg = DecodeConfig(gen_len=64, block_len=16, cache=cache, rule=rule, threshold=0.7,
                                       early_stop=False)
                    eager_steps, eager, _ = decode(lm, prompts, cfg, graphs=False)
                    graph_steps, graphed, forward = decode(lm, prompts, cfg, graphs=True)
                    same = graph_steps == eager_steps and graphed.canvas.tolist() == eager.canvas.tolist() \
                        and graphed.nfe == eager.nfe
                    used = forward.graphs and forward.replays > 0
                    failures += not (same and used)
                    print(f"{family:5s} {cache:6s} {rule:9s} NFE {eager.nfe:3d}  graph captures {forward.captures:2d} "
                          f"replays {forward.replays:3d}  {'identical' if same else 'DIFFERENT'}"
                          f"{'' if used else '  (graphs not used)'}", flush=True)
    SpanForward.for_model = original
    print("all identical" if not failures else f"{failures} case(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
