#!/usr/bin/env python3
"""Train a built-in model (CPU, seeded, resumable).

    python scripts/train_tiny.py --recipe tiny-llada  # word problems + function tasks + Python source
    python scripts/train_tiny.py                      # tiny-code: Python source only
    python scripts/train_tiny.py --resume             # continue from the state dir's state.pt (or the export)
    python scripts/train_tiny.py --max-minutes 170    # stop cleanly before a 3-hour job limit

The export goes to runs/<recipe>/export unless --out says otherwise; copy it into
fastdllm/checkpoints/builtin/ once scripts/eval_builtin.py shows it beats the shipped one.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdllm import host_memory  # noqa: E402
from fastdllm.training.train import TrainConfig, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="default: runs/<recipe>/export")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: runs/<recipe>")
    parser.add_argument("--resume", action="store_true")
    for f in fields(TrainConfig):
        if f.name in ("out", "state_dir"):
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind if kind is not str else None, default=f.default)
    args = vars(parser.parse_args())
    resume = args.pop("resume")
    run_dir = ROOT / "runs" / ("tiny" if args["recipe"] == "stdlib" else args["recipe"])
    args["state_dir"] = args["state_dir"] or run_dir
    args["out"] = args["out"] or run_dir / "export"
    if args.get("corpus_root"):
        args["corpus_root"] = Path(args["corpus_root"])
    print(f"allocator: {host_memory.keep_freed()}", flush=True)   # freed activations reused, not page-faulted back
    train(TrainConfig(**args), resume=resume, log=lambda msg: print(msg, flush=True))


if __name__ == "__main__":
    main()
