"""next_line.yaml's data, found beside this file from whatever folder `fastdllm eval` runs in: the
YAML names it with `custom_dataset: !function hooks.load_docs`, as the built-in tasks do
(fastdllm/eval/builtin_tasks/hooks.py). lm-eval loads this file by its path, beside the YAML."""

from pathlib import Path

from fastdllm.eval.builtin_tasks.hooks import read_docs

HERE = Path(__file__).resolve().parent


def load_docs(data_file: str, **_metadata):
    """{"test": the rows of `data_file` beside this file} (lm-eval passes the task's metadata and
    dataset_kwargs as keywords)."""
    return read_docs(HERE / data_file, "the task's data", "(scripts/make_next_line_task.py writes it)")
