#!/usr/bin/env python3
"""The cost of structured output (docs/specs/structured-output.md): the same prompts decoded with and
without a JSON Schema, one row each (a benchmark, not a test).

    python benchmarks/bench_structured.py                          # the built-in model, fp32
    python benchmarks/bench_structured.py --random-shape           # a random LLaDA of ~0.5B parameters

Per row: answers valid / answers (jsonschema), answer tokens, NFE, answer tokens per forward, the
engine's committed positions per forward (with a schema this counts the end-token filler after a
finished answer), tokens/s, ms per step and the matcher's ms per step (mask + validation + forced
tokens). One warm-up run per row is not counted; rows run interleaved, `--reps` times, and the
figures are medians over the repetitions.
"""

from __future__ import annotations

import json
import statistics
import time

import jsonschema

import harness
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


def random_shape(dtype: str) -> loading.LoadedModel:
    """~0.5B: 24 layers of d 1024 (0.33B) and the 32k-token embedding and head (0.07B), random weights."""
    shape = harness.Shape("random LLaDA d1024, 24 layers, 16 heads, MLP 4096, vocab 32000", "llada",
                          dict(d_model=1024, n_layers=24, n_heads=16, n_kv_heads=16, mlp_hidden_size=4096),
                          dict(vocab_size=32000))
    return harness.build(shape, dtype)


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__, reps=2, dtype="fp32")
    ap.add_argument("--random-shape", action="store_true")
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--cache", default="prefix")
    ap.add_argument("--rule", default="threshold")
    args = harness.parse(ap, argv)
    lm = random_shape(args.dtype) if args.random_shape else loading.load(resolve_model_dir(None), dtype=args.dtype)
    compiled = Compiled(Spec("json_schema", json.dumps(SCHEMA)), lm.tokenizer)
    cfg = DecodeConfig(gen_len=args.gen_len, cache=args.cache, rule=args.rule)
    prompts = [lm.encode(p, chat=False) for p in PROMPTS]

    def row(c):                 # every prompt alone: (results, seconds)
        began = time.perf_counter()
        return [run(lm.decoder, [p], cfg, constraints=[c] if c else None) for p in prompts], time.perf_counter() - began

    seen = harness.interleaved({"none": lambda: row(None), "schema": lambda: row(compiled)}, reps=args.reps)
    params = sum(p.numel() for p in lm.model.parameters())
    print(f"# {harness.machine('cpu', args.dtype)}")
    print(f"# {lm.path.name if not args.random_shape else 'random LLaDA'} ({params / 1e9:.2f}B parameters), "
          f"cache {args.cache}, rule {args.rule}, gen_len {args.gen_len}, {len(prompts)} prompts x {args.reps} reps")
    print("| constraint | valid | answer tokens | NFE | tokens/forward | committed/forward | tokens/s | ms/step | matcher ms/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    records = []
    for name, reps in seen.items():
        results = reps[0][0]
        tokens, nfe = sum(r.generated_tokens for r in results), sum(r.nfe for r in results)
        committed = sum(r.committed for r in results)
        seconds = statistics.median(s for _, s in reps)
        matcher = statistics.median(sum(r.matcher_seconds for r in rs) for rs, _ in reps)
        valid = sum(valid_json(r.texts[0]) for r in results)
        records.append(dict(constraint=name, valid=valid, answers=len(results), tokens=tokens, nfe=nfe,
                            seconds=seconds, matcher_seconds=matcher, spread=harness.spread([s for _, s in reps])))
        print(f"| {name} | {valid}/{len(results)} | {tokens} | {nfe} | {tokens / nfe:.2f} | {committed / nfe:.2f} | "
              f"{tokens / seconds:.1f} | {1e3 * seconds / nfe:.1f} | {1e3 * matcher / nfe:.2f} |")
    harness.write_json(args, records, cache=args.cache, rule=args.rule, gen_len=args.gen_len)


def valid_json(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


if __name__ == "__main__":
    main()
