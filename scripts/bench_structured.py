#!/usr/bin/env python3
"""The cost of structured output (docs/structured-output.md): the same prompts decoded with and
without a JSON Schema, one row each (a benchmark, not a test).

    python scripts/bench_structured.py                          # the built-in model, fp32
    python scripts/bench_structured.py --random-shape           # a random LLaDA of ~0.5B parameters

Per row: answers valid / answers (jsonschema), answer tokens, NFE, answer tokens per forward, the
engine's committed positions per forward (with a schema this counts the end-token filler after a
finished answer), tokens/s, ms per step and the matcher's ms per step (mask + validation + forced
tokens). One warm-up run per row is not counted; rows run interleaved, `--reps` times, and the
figures are medians over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import torch

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.constraint import Compiled, Spec
from fastdllm.decode.engine import run

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "args", "returns"],
          "properties": {"name": {"type": "string", "pattern": "^[a-z_]{1,12}$"},
                         "args": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3},
                         "returns": {"type": "string", "enum": ["int", "str", "list", "None"]}}}
PROMPTS = ["def add(a, b):", "# describe the function\ndef parse(text):", "import json\n\ndef load(path):"]


def random_shape(tmp: Path, dtype: str) -> loading.LoadedModel:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from speed import in_memory                                    # scripts/speed.py
    from fastdllm.checkpoints.tiny_random import write_llada

    path = write_llada(tmp / "m", d_model=64, n_layers=1, n_heads=4, mlp_hidden_size=128, vocab_size=32000)
    lm = loading.load(path, dtype=dtype)
    # ~0.5B: 24 layers of d 1024 (0.33B) and the 32k-token embedding and head (0.07B)
    return in_memory(lm, "llada", dict(d_model=1024, n_layers=24, n_heads=16, n_kv_heads=16, mlp_hidden_size=4096))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random-shape", action="store_true")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--cache", default="prefix")
    ap.add_argument("--rule", default="threshold")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lm = random_shape(Path(tmp), args.dtype) if args.random_shape else loading.load(resolve_model_dir(None), dtype=args.dtype)
        compiled = Compiled(Spec("json_schema", json.dumps(SCHEMA)), lm.tokenizer)
        cfg = DecodeConfig(gen_len=args.gen_len, cache=args.cache, rule=args.rule)
        prompts = [lm.encode(p, chat=False) for p in PROMPTS]
        rows = {"none": None, "schema": compiled}
        for c in rows.values():                                    # warm-up, not counted
            run(lm.decoder, prompts[:1], cfg, constraints=[c] if c else None)
        seen = {name: [] for name in rows}
        for _ in range(args.reps):
            for name, c in rows.items():
                results, began = [], time.perf_counter()
                for p in prompts:
                    results.append(run(lm.decoder, [p], cfg, constraints=[c] if c else None))
                seen[name].append((results, time.perf_counter() - began))
        params = sum(p.numel() for p in lm.model.parameters())
        print(f"# {lm.path.name if not args.random_shape else 'random LLaDA'} ({params / 1e9:.2f}B parameters), "
              f"{args.dtype}, {torch.get_num_threads()} threads, cache {args.cache}, rule {args.rule}, "
              f"gen_len {args.gen_len}, {len(prompts)} prompts x {args.reps} reps")
        print("| constraint | valid | answer tokens | NFE | tokens/forward | committed/forward | tokens/s | ms/step | matcher ms/step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, reps in seen.items():
            results = reps[0][0]
            tokens = sum(r.generated_tokens for r in results)
            nfe = sum(r.nfe for r in results)
            committed = sum(r.committed for r in results)
            seconds = statistics.median(s for _, s in reps)
            matcher = statistics.median(sum(r.matcher_seconds for r in rs) for rs, _ in reps)
            valid = sum(valid_json(r.texts[0]) for r in results)
            print(f"| {name} | {valid}/{len(results)} | {tokens} | {nfe} | {tokens / nfe:.2f} | {committed / nfe:.2f} | "
                  f"{tokens / seconds:.1f} | {1e3 * seconds / nfe:.1f} | {1e3 * matcher / nfe:.2f} |")


def valid_json(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


if __name__ == "__main__":
    main()
