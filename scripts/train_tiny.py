#!/usr/bin/env python3
"""Train the built-in tiny code model (CPU, seeded, resumable).

    python scripts/train_tiny.py                      # train from scratch into fastdllm/checkpoints/builtin/tiny-code
    python scripts/train_tiny.py --resume             # continue from runs/tiny/state.pt (or the export)
    python scripts/train_tiny.py --max-minutes 170    # stop cleanly before a 3-hour job limit
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdllm.training.train import TrainConfig, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "fastdllm" / "builtin" / "tiny-code")
    parser.add_argument("--state-dir", type=Path, default=ROOT / "runs" / "tiny")
    parser.add_argument("--resume", action="store_true")
    for f in fields(TrainConfig):
        if f.name in ("out", "state_dir"):
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind if kind is not str else None, default=f.default)
    args = vars(parser.parse_args())
    resume = args.pop("resume")
    if args.get("corpus_root"):
        args["corpus_root"] = Path(args["corpus_root"])
    train(TrainConfig(**args), resume=resume, log=lambda msg: print(msg, flush=True))


if __name__ == "__main__":
    main()
