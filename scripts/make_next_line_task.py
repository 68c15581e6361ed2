"""Write examples/eval/next_line.jsonl: a local lm-eval task from the built-in model's held-out
source (fastdllm/training/data.py HELD_OUT; never seen in training). Each row: a function from its
`def` line up to a cut point as the context, the next non-blank line as the target (exact match).

    python scripts/make_next_line_task.py [--rows 60] [--out examples/eval/next_line.jsonl]

Cut points: every function of 3 to 30 lines, in sorted file order and source order, cut after
its signature (and docstring) and after every third body line, skipping targets that are blank, comments or
longer than 100 characters. The text depends on the Python version that runs this (its stdlib).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastdllm.training.data import corpus_files, functions, read  # noqa: E402


def after_docstring(header: str, body: str) -> int:
    """The index of the body line after its docstring (0 without one)."""
    tree = ast.parse(header + body).body[0]
    first = tree.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
            and isinstance(first.value.value, str):
        return first.end_lineno - header.count("\n")
    return 0


def rows(limit: int) -> list[dict]:
    out = []
    _, held = corpus_files()
    for path in sorted(held):
        found = functions(read(path))
        for header, body in found:
            lines = body.splitlines(keepends=True)
            if not 3 <= len(lines) <= 30:
                continue
            for cut in range(after_docstring(header, body), len(lines) - 1, 3):
                target = lines[cut].rstrip("\n")
                if not target.strip() or target.strip().startswith("#") or len(target) > 100:
                    continue
                out.append({"module": path.stem, "context": header + "".join(lines[:cut]), "target": target})
                if len(out) == limit:
                    return out
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("examples/eval/next_line.jsonl"))
    args = parser.parse_args()
    found = rows(args.rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in found))
    print(f"{len(found)} rows -> {args.out} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
