#!/usr/bin/env python3
"""The catalog's sizes (fastdllm/checkpoints/catalog.yaml): parameters, active parameters, context
and memory at bf16 / 8-bit / 4-bit, from `fastdllm info`'s estimate (checkpoints/info.py) with each
entry's published config built on the meta device (no weights). tests/cli/test_catalog.py checks the
file against this.

    python scripts/catalog_sizes.py            # print them
    python scripts/catalog_sizes.py --write    # rewrite each entry's `sizes:` line in place
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdllm.checkpoints import catalog  # noqa: E402

PUBLISHED_CONFIGS = ROOT / "tests" / "published_configs"


def published_config(shape: str) -> dict | None:
    """config.json of a `shape:` value (catalog.yaml's header says which places these are)."""
    kind, _, name = shape.partition(":")
    if kind == "fixture":
        return json.loads((PUBLISHED_CONFIGS / f"{name}.json").read_text())
    if kind == "package":
        return json.loads((ROOT / "fastdllm" / "checkpoints" / "published" / name / "config.json").read_text())
    if kind == "writer" and name == "rnd1":
        from fastdllm.testing.tiny_rnd1 import rnd1_config

        return rnd1_config()
    if kind == "writer" and name == "illada":
        from fastdllm.testing.tiny_illada import illada_config

        return illada_config()
    if kind == "writer" and name == "diffusion_gemma":
        from fastdllm.testing.tiny_gemma import PUBLISHED_TEXT, gemma_config

        text = {k: v for k, v in PUBLISHED_TEXT.items() if k not in ("num_hidden_layers", "vocab_size",
                                                                     "final_logit_softcapping", "max_position_embeddings")}
        # 30 layers, five sliding-window layers then one global (docs/specs/diffusion-gemma.md §1)
        layers = tuple("full_attention" if i % 6 == 5 else "sliding_attention" for i in range(30))
        config = gemma_config(vocab_size=PUBLISHED_TEXT["vocab_size"], layer_types=layers, canvas_length=256, **text)
        return config
    entry = catalog.entries().get(shape)                # the same architecture as another entry
    return published_config(entry.shape) if entry is not None and entry.shape else None


def sizes_of(raw: dict) -> dict:
    """info's numbers for a config: the model built on the meta device, nothing allocated."""
    import torch

    from fastdllm.checkpoints.family import family_of
    from fastdllm.checkpoints.info import memory_estimate, shape_summary

    config, model_cls, _ = family_of(raw, Path("config"), refuse=False)
    config._attn_implementation = "eager"               # as loading.py asks (SDAR's config names flex)
    with torch.device("meta"):
        model = model_cls(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    info = shape_summary(shapes, config)
    memory = memory_estimate(info, catalog.CANVAS_TOKENS)
    context = getattr(config, "max_position_embeddings", None) or raw.get("text_config", {}).get("max_position_embeddings")
    return {"parameters": int(info["parameters"]), "active": int(info["active_parameters"]), "context": int(context),
            **{f"{p}_gib": round(memory[p]["total"] / catalog.GIB, 1) for p in catalog.PRECISIONS}}


def flow(sizes: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sizes.items()) + "}"


def write(all_sizes: dict[str, dict]) -> None:
    """Replace each entry's `sizes:` line, keeping the file's comments and order."""
    lines, current = catalog.CATALOG_FILE.read_text().splitlines(), None
    for i, line in enumerate(lines):
        if re.match(r"^[^\s#][^:]*:[^:\s]+:\s*$", line):                 # an entry's `family:tag:` line
            current = line.rstrip()[:-1]
        elif line.startswith("  sizes:") and current in all_sizes:
            lines[i] = f"  sizes: {flow(all_sizes[current])}"
    catalog.CATALOG_FILE.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite catalog.yaml's sizes lines")
    args = ap.parse_args()
    found = {}
    for name, entry in catalog.entries().items():
        raw = published_config(entry.shape) if entry.shape else None
        found[name] = sizes_of(raw) if raw is not None else {}
        print(f"{name:28} {flow(found[name])}")
    if args.write:
        write(found)


if __name__ == "__main__":
    main()
