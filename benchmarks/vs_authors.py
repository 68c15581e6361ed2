#!/usr/bin/env python3
"""fastdllm against the authors' LLaDA code, per step, in every cache mode (a benchmark, not a test).

    python benchmarks/vs_authors.py --authors ~/src/Fast-dLLM            # mid shape, fp32 and bf16
    python benchmarks/vs_authors.py --authors ~/src/Fast-dLLM --dtypes bf16 --modes dual --reps 5

`--authors` is a checkout of NVlabs/Fast-dLLM; nothing of it is part of fastdllm. Its
`llada/generate.py` (`generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`) and its
`llada/model` (`LLaDAModelLM`, `LLaDAConfig`) are imported from that path at run time.

One random checkpoint in LLaDA-8B-Instruct's published layout (config.json, tensor names) is written
with fastdllm's writer (`write_llada`; default: the harness's "mid" shape, d_model 512,
8 layers, 8 heads, MLP 1408, with LLaDA's vocabulary size 126464; `logit_scale` makes the confidences
peaked and varied, so that the threshold rule commits one to several tokens a step, as a trained model
does). The authors' model is built from that config.json with their config class and loads the
safetensors state dict (strict); fastdllm loads the same directory with `fastdllm.checkpoints.loading.load`.
Both get the same prompt (random ids), gen_len, block length and the threshold rule (commit every
masked position of the block whose confidence >= threshold, at least the best one; greedy, prob
confidence, no early stop): the authors' `generate` (cache none), `generate_with_prefix_cache`,
`generate_with_dual_cache` with `threshold=`, against `fastdllm.decode.engine.run` with
`DecodeConfig(cache=none|prefix|dual, rule="threshold")`; or, with `--rule fixed`, one token a step
(their `steps=gen_len, threshold=None`; our rule "fixed"). Per step = a whole generation's wall time
over its NFE (the authors' functions return theirs). One warm-up generation each (every shape: their sdpa is torch.compiled), then `--reps`
repetitions interleaved (dtype, mode: authors, fastdllm, ...); the table gives medians and the spread
(min-max) of the per-repetition ratio authors/fastdllm, and whether the two decoded the same tokens
(they should, up to floating-point ties: README "Differences from the authors' code, on purpose").

Compatibility with transformers 5 (the authors' code targets 4.x), done here at run time, their
files untouched: `einops` (only their block-diffusion block uses it, never LLaDA's llama block) is
stubbed when it is not installed; `from_pretrained` fails on 5.x (their `__init__` never calls
`post_init`), so the model is built from the config and loads the state dict; `use_cache`, which
5.x no longer keeps on a config, is set on it again.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import harness
import torch
import transformers
from safetensors.torch import load_file

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTHORS_FN = {"none": "generate", "prefix": "generate_with_prefix_cache", "dual": "generate_with_dual_cache"}


def import_authors(root: Path):
    """The authors' generate module and config class, imported from their checkout."""
    llada = root / "llada"
    if not (llada / "generate.py").is_file():
        sys.exit(f"{root} is not a checkout of NVlabs/Fast-dLLM (no llada/generate.py)")
    try:
        import einops  # noqa: F401
    except ImportError:                 # used only by their block-diffusion block, not LLaDA's
        stub = types.ModuleType("einops")
        stub.rearrange = lambda *a, **k: (_ for _ in ()).throw(NotImplementedError("einops stub"))
        sys.modules["einops"] = stub
    sys.path.insert(0, str(llada))
    import generate as authors  # (their llada/generate.py)
    from model.configuration_llada import LLaDAConfig  # (their llada/model)
    transformers.logging.set_verbosity_error()
    return authors, LLaDAConfig


def authors_model(authors, config_cls, path: Path, dtype: torch.dtype):
    """Their LLaDAModelLM on the checkpoint: built from config.json, state dict loaded strictly."""
    config = config_cls(**json.loads((path / "config.json").read_text()))
    config.use_cache = False            # transformers 5 drops it from the config; their forward reads it
    model = authors.LLaDAModelLM(config)
    state = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(shard))
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def revision(root: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"


def time_authors(authors, model, prompt: torch.Tensor, mode: str, args, mask: int, gen_len: int):
    fn = getattr(authors, AUTHORS_FN[mode])
    start = time.perf_counter()
    x, nfe = fn(model, prompt, steps=gen_len, gen_length=gen_len, block_length=args.block_len,
                temperature=0.0, remasking="low_confidence", mask_id=mask,
                threshold=args.threshold if args.rule == "threshold" else None)
    seconds = time.perf_counter() - start
    return seconds, nfe, x[0, prompt.shape[1]:].tolist()


def time_fastdllm(lm, prompt: list[int], mode: str, args, gen_len: int):
    cfg = DecodeConfig(gen_len=gen_len, block_len=args.block_len, cache=mode, rule=args.rule,
                       threshold=args.threshold, early_stop=False)
    seconds, result = harness.decode(lm, [prompt], cfg, warmup_blocks=0)    # warmed up in main
    return seconds, result.nfe, result.canvas[0].tolist()


def agreement(a: list[int], b: list[int]) -> str:
    same = sum(x == y for x, y in zip(a, b))
    if same == len(a) == len(b):
        return "yes"
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"{same}/{len(a)} (first diff at {first})"


def table(runs: dict, dtypes: list[str], modes: list[str]) -> None:
    """The table so far: runs[dtype, mode, "a" (authors) or "f" (fastdllm)] -> (seconds, NFE, tokens)."""
    print(f"{'mode':7s} {'dtype':5s} {'authors ms/step':>15s} {'fastdllm ms/step':>16s} {'ratio':>6s} "
          f"{'(min-max)':>11s} {'NFE a/f':>8s}  tokens equal")
    for d in dtypes:
        for mode in modes:
            ra, rf = runs[d, mode, "a"], runs[d, mode, "f"]
            a = [1000 * s / n for s, n, _ in ra]
            f = [1000 * s / n for s, n, _ in rf]
            ratios = [x / y for x, y in zip(a, f)]
            ma, mf = statistics.median(a), statistics.median(f)
            nfe = f"{ra[0][1]}/{rf[0][1]}"
            print(f"{mode:7s} {d:5s} {ma:15.1f} {mf:16.1f} {ma / mf:6.2f} {min(ratios):5.2f}-{max(ratios):<5.2f} "
                  f"{nfe:>8s}  {agreement(ra[0][2], rf[0][2])}", flush=True)


def main() -> None:
    ap = harness.parser(__doc__, reps=3)
    ap.add_argument("--authors", type=Path, required=True, help="a checkout of NVlabs/Fast-dLLM")
    harness.add_llada_shape(ap, vocab=126464)                      # LLaDA's vocabulary size
    ap.add_argument("--logit-scale", type=float, default=40.0, help="write_llada's logit_scale (peaked confidences)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--rule", choices=("threshold", "fixed"), default="threshold",
                    help="threshold (their threshold=); fixed: one token a step (their steps=gen_len, threshold=None)")
    ap.add_argument("--modes", default="none,prefix,dual")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--checkpoint", type=Path, help="reuse (or write once into) this directory")
    args = harness.parse(ap)
    modes, dtypes = args.modes.split(","), args.dtypes.split(",")

    authors, config_cls = import_authors(args.authors.expanduser().resolve())
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or Path(tmp) / "llada"
        if not (path / "config.json").is_file():
            harness.write_random(harness.llada_shape(args), path, logit_scale=args.logit_scale)
        theirs = {d: authors_model(authors, config_cls, path, DTYPES[d]) for d in dtypes}
        ours = {d: loading.load(path, dtype=d, device="cpu") for d in dtypes}
        config = json.loads((path / "config.json").read_text())
    mask = ours[dtypes[0]].specials.mask
    assert mask == config["mask_token_id"]
    prompt = harness.prompt_ids(args.prompt)
    tensor = torch.tensor([prompt])

    print(f"# model: random LLaDA (published layout) d_model {config['d_model']}, {config['n_layers']} layers, "
          f"{config['n_heads']} heads, MLP {config['mlp_hidden_size']}, vocab {config['vocab_size']}, "
          f"logit_scale {args.logit_scale:g}; bf16 on disk")
    rule = f"threshold {args.threshold:g}" if args.rule == "threshold" else "one token a step"
    print(f"# prompt {args.prompt}, gen_len {args.gen_len}, block {args.block_len}, {rule} "
          f"(greedy, prob confidence, no early stop); {args.reps} interleaved reps after one warm-up, medians")
    print(f"# authors: NVlabs/Fast-dLLM {revision(args.authors)} llada/generate.py at {args.authors}")
    print(f"# {harness.machine('cpu', dtypes[-1])}; transformers {transformers.__version__}; "
          f"python {platform.python_version()}"
          + (f"; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}" if "OMP_NUM_THREADS" in os.environ else ""),
          flush=True)

    # every (dtype, mode): the authors' run, then ours; one warm-up round (their sdpa is torch.compiled)
    runs = {(d, mode, who): (lambda d=d, mode=mode: time_authors(authors, theirs[d], tensor, mode, args, mask, args.gen_len))
            if who == "a" else (lambda d=d, mode=mode: time_fastdllm(ours[d], prompt, mode, args, args.gen_len))
            for d in dtypes for mode in modes for who in "af"}

    def after_round(i: int, so_far: dict) -> None:
        print(f"\n# after rep {i + 1}/{args.reps}, load average {harness.loadavg()}")
        table(so_far, dtypes, modes)
    harness.interleaved(runs, args.reps, warmup=1, after_round=after_round)
    print(f"# load average at the end {harness.loadavg()}")


if __name__ == "__main__":
    main()
