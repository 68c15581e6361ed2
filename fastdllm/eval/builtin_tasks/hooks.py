"""The Python side of the built-in tasks' YAMLs (`!function hooks.NAME`): their data and their grading.

lm-eval loads this file by its path, beside the YAML that names it, as a module of its own (not
as `fastdllm.eval.builtin_tasks.hooks`), so it imports fastdllm by absolute names only.

- load_docs: the task's JSONL file, found beside this file (lm-eval's `dataset_path: json` reads
  `data_files` relative to the current directory; this works from anywhere); read_docs: the same
  for a local task's own hooks.py (examples/eval/hooks.py).
- strict_numbers / flexible_numbers: lm-eval filters that grade as gsm8k's strict-match (the
  number after `####`) and flexible-extract (the last number in the answer), with commas, `$` and
  a trailing period removed; lm-eval's exact_match then compares the number with `target`.
- code_results: pass@1 of one completion (prompt + body + the task's `check`), run by
  fastdllm.code_execution.passes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
INVALID = "[invalid]"                       # lm-eval's regex filter's fallback: equals no target

STRICT = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
NUMBER = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")
CODE_TIMEOUT = 5.0                          # seconds per program; the reference bodies take ~0.05 s


def load_docs(data_file: str, **_metadata):
    """{"test": the rows of `data_file`} as lm-eval's `custom_dataset` hook wants (it passes the
    task's metadata and dataset_kwargs as keywords)."""
    return read_docs(HERE / data_file, "the built-in task's data", "(scripts/make_builtin_tasks.py writes "
                     "tiny_gsm.jsonl and tiny_code.jsonl)")


def read_docs(path: Path, what: str = "the task's data", remedy: str = ""):
    """{"test": the rows of the JSONL file at `path`}; a missing file is one line naming it (a local
    task's hooks.py calls this with the path beside its YAML: examples/eval/hooks.py)."""
    import datasets

    from fastdllm.errors import UserError

    if not path.is_file():
        raise UserError(f"{what} {path} is missing" + (f" {remedy}" if remedy else ""))
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def normalized(number: str) -> str:
    """gsm8k's clean-up of an extracted number: no commas, no `$`, no trailing period."""
    return number.replace(",", "").replace("$", "").rstrip(".")


def strict_answer(text: str) -> str:
    """The number after the first `####`, or INVALID."""
    match = STRICT.search(text)
    return normalized(match.group(1)) if match else INVALID


def flexible_answer(text: str) -> str:
    """The last number in the text, or INVALID."""
    found = NUMBER.findall(text)
    return normalized(found[-1]) if found else INVALID


def strict_numbers(resps, docs):
    return [[strict_answer(r or "") for r in answers] for answers in resps]


def flexible_numbers(resps, docs):
    return [[flexible_answer(r or "") for r in answers] for answers in resps]


def program(doc: dict, completion: str) -> str:
    """What runs for one completion: HumanEval's layout (prompt, body, test, the call of check)."""
    return doc["prompt"] + completion + "\n" + doc["test"] + f"\ncheck({doc['entry_point']})\n"


def code_results(doc: dict, results: list[str]) -> dict[str, float]:
    from fastdllm.code_execution import passes

    passed, _ = passes(program(doc, results[0]), timeout=CODE_TIMEOUT)
    return {"pass@1": float(passed)}
