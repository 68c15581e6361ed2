#!/usr/bin/env python3
"""Evaluate a tiny-llada checkpoint and write its model card: every figure in the card comes from a
command this script runs (shown beside it), on the held-out tasks the training never saw.

    python scripts/eval_builtin.py runs/tiny-llada/export                  # figures on stdout
    python scripts/eval_builtin.py runs/tiny-llada/export --write-card     # and (re)write its README.md
    python scripts/eval_builtin.py DIR --limit 20 --parts paper256         # a quick look while training

The card keeps whatever is written below its HAND_WRITTEN marker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdllm.checkpoints.builtin import builtin_model_path  # noqa: E402
from fastdllm.training import function_tasks, word_problems  # noqa: E402

HAND_WRITTEN = "<!-- Hand-written below this line; scripts/eval_builtin.py --write-card keeps it. -->"
TASKS = "tiny-gsm,tiny-code,tiny-gsm-others"
BASELINE_AND_DEFAULT = ["--profiles", "baseline,default"]
PARTS = {                           # name: (generation lengths, rows, quantization)
    "paper": ("256,512", ["--suite", "paper"], None),
    "paper256": ("256", ["--suite", "paper"], None),
    "int8": ("256", BASELINE_AND_DEFAULT, "int8"),
    "int4": ("256", BASELINE_AND_DEFAULT, "int4"),
    "accelerators": ("256", ["--suite", "accelerators"], None),
}
QUICK_START = ["generate", "--profile", "code", "def fibonacci(n):"]
WORD_PROBLEM = "Maya has 17 pencils. She buys 3 boxes with 8 pencils in each box. How many pencils does she have now?"


def fastdllm(args: list[str], model: Path, stdin: str | None = None, timeout: int = 7200) -> tuple[str, str, float]:
    """(stdout, the command as a user types it, seconds) of one fastdllm command on `model`."""
    cmd = [sys.executable, "-m", "fastdllm", *args, "-m", str(model)]
    env = {**os.environ, "COLUMNS": "160", "NO_COLOR": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    named = model.name if builtin_model_path(model.name) == model.resolve() else str(model)
    shown = "fastdllm " + " ".join(a if " " not in a and "(" not in a else repr(a) for a in args)
    shown += "" if builtin_model_path() == model.resolve() else f" -m {named}"   # the default model needs no -m
    return done.stdout, shown, seconds


def table1(model: Path, limit: int | None, gen_lens: str, rows: list[str], quantize: str | None = None):
    """`rows`: ["--suite", NAME] (the paper's rows, the accelerators) or ["--profiles", "a,b"]."""
    args = ["eval", "--tasks", TASKS, *rows, "--gen-lens", gen_lens, "--format", "md"]
    args += ["--limit", str(limit)] if limit else []
    args += ["--quantize", quantize] if quantize else []
    return fastdllm(args, model)


def signature_commands(model: Path) -> list[tuple[str, str, float]]:
    """The quick start's answer (and whether it is a working fibonacci), a chat turn with a word
    problem, and bench's long canvas."""
    out = []
    answer, shown, seconds = fastdllm(QUICK_START + ["--no-live"], model)
    out.append((shown, answer + f"\n# fibonacci works: {fibonacci_works('def fibonacci(n):' + answer)}", seconds))
    transcript, shown, seconds = fastdllm(["chat"], model, stdin=WORD_PROBLEM + "\n/bye\n")
    out.append((f"printf '{WORD_PROBLEM}\\n/bye\\n' | {shown}", transcript, seconds))
    table, shown, seconds = fastdllm(["bench", "--gen-len", "1024"], model)
    out.append((shown, table, seconds))
    return out


def fibonacci_works(source: str) -> bool:
    from fastdllm.code_execution import passes

    test = "\nassert [fibonacci(i) for i in range(10)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"
    return passes(source + test, timeout=5.0)[0]


def facts(model: Path) -> dict:
    from safetensors.torch import load_file

    params = sum(t.numel() for t in load_file(str(model / "model.safetensors")).values())
    return {"config": json.loads((model / "config.json").read_text()),
            "state": json.loads((model / "trainer_state.json").read_text()), "params": params,
            "bytes": sum(p.stat().st_size for p in model.iterdir() if p.is_file())}


def machine() -> str:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}"


def held_out_declaration() -> str:
    wp, ft = word_problems, function_tasks
    return "\n".join([
        f"- `tiny-gsm` (200 problems, `fastdllm/training/word_problems.py` split `heldout`, seed 2026): story kinds "
        f"{', '.join(sorted({'fewer_than', 'pages_left', 'shared_bill'}))} are never in training; chain and change "
        f"problems use held-out sentence phrasings; people ({', '.join(wp.NAMES['heldout'])}), objects "
        f"({', '.join(wp.ITEMS['heldout'])}) and containers ({', '.join(wp.CONTAINERS['heldout'])}) never appear in "
        f"training; every held-out question holds a number from {wp.HELD_BAND.start} to {wp.HELD_BAND.stop - 1}, "
        f"which no training question holds.",
        f"- `tiny-code` (164 tasks, `fastdllm/training/function_tasks.py` split `heldout`, seed 2026): the "
        f"(filter, map, aggregate) and (character class, operation) combinations of a fixed fifth, chosen by hash, are "
        f"never in training (each part is); parameter names {', '.join(ft.LIST_PARAMS['heldout'] + ft.STRING_PARAMS['heldout'])} "
        f"and the docstring verb \"{ft.VERBS['heldout'][0]}\" only in held-out tasks.",
        "- `tiny-gsm-others` (40 problems): written by hand by someone who never read the generators; "
        "other settings, sentence shapes and number words (\"a dozen\", \"twice\").",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--parts", default="paper,int8,int4,accelerators,commands",
                        help=f"what to measure, comma list of {', '.join(PARTS)}, commands (default: all)")
    parser.add_argument("--write-card", action="store_true")
    args = parser.parse_args()
    figures = {"machine": machine(), "facts": facts(args.model), "tables": [], "commands": []}
    for part in args.parts.split(","):
        if part == "commands":
            figures["commands"] = signature_commands(args.model)
            for shown, text, seconds in figures["commands"]:
                print(f"$ {shown}\n{text}\n({seconds:.1f} s)", flush=True)
            continue
        gen_lens, rows, quantize = PARTS[part]
        text, shown, seconds = table1(args.model, args.limit, gen_lens, rows, quantize)
        figures["tables"].append((shown, text, seconds))
        print(f"$ {shown}\n{text}", flush=True)
    if args.write_card:
        from card_builtin import write_card

        write_card(args.model, figures, held_out_declaration(), HAND_WRITTEN)


if __name__ == "__main__":
    main()
