"""lm-eval tasks that ship with fastdllm, graded offline: `tiny-gsm`, `tiny-gsm-others`, `tiny-code`.

Each task is a YAML here with its data beside it (the JSONL files, written by
scripts/make_builtin_tasks.py, except tiny_gsm_others.jsonl, which is written by hand); hooks.py
loads the data and grades. fastdllm.eval.tasks.task_manager indexes this folder on every run, so
`fastdllm eval --tasks tiny-gsm` needs no --include-path.
"""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
