"""Write the data of fastdllm's built-in lm-eval tasks (fastdllm/eval/builtin_tasks/):

    python scripts/make_builtin_tasks.py            # (re)write the files
    python scripts/make_builtin_tasks.py --check    # exit 1 if a file differs from what it would write

- tiny_gsm.jsonl: word_problems.held_out_set(200) (question, answer, target, kind)
- tiny_code.jsonl: function_tasks.held_out_set(164) (task_id, prompt, canonical_solution,
  entry_point, test, kind)

Both sets come from fixed seeds, so a rerun writes identical bytes. tiny_gsm_others.jsonl is
written by hand and not touched here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastdllm.eval.builtin_tasks import FOLDER  # noqa: E402
from fastdllm.training import function_tasks, word_problems  # noqa: E402

GSM_PROBLEMS, CODE_TASKS = 200, 164             # GSM8K-like size; HumanEval's 164


def files() -> dict[str, str]:
    """{file name: its text}: one JSON object a line, keys in the generators' order."""
    sets = {"tiny_gsm.jsonl": word_problems.held_out_set(GSM_PROBLEMS),
            "tiny_code.jsonl": function_tasks.held_out_set(CODE_TASKS)}
    return {name: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows) for name, rows in sets.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = parser.parse_args()
    stale = []
    for name, text in files().items():
        path = FOLDER / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        path.write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {path.relative_to(ROOT)} ({text.count(chr(10))} rows)", file=sys.stderr)
    if stale:
        print(f"stale: {', '.join(stale)} (run python scripts/make_builtin_tasks.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
