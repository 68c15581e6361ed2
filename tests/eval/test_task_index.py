"""lm-eval's own task index kept on disk (fastdllm/eval/task_index.py): built once, read back while
lm-eval's task folder is unchanged, built again when it changes or the file is unreadable, and
what a TaskManager gets from it is what lm-eval builds itself."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from fastdllm.eval import task_index  # noqa: E402

TASKS = Path(__file__).resolve().parents[1] / "eval_task"


def test_the_index_is_kept_and_read_back_while_the_folder_is_unchanged(tmp_path, monkeypatch):
    folder = tmp_path / "tasks"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "t.yaml").write_text("task: t\n")
    monkeypatch.setenv("FASTDLLM_CACHE_DIR", str(tmp_path / "cache"))
    builds = []

    def build(paths):
        builds.append(list(paths))
        return {"t": len(builds)}

    assert task_index._own_index(folder, build) == {"t": 1} and builds == [[folder]]
    assert task_index._own_index(folder, build) == {"t": 1} and len(builds) == 1     # read back
    (folder / "a" / "u.yaml").write_text("task: u\n")                                # a new task file
    assert task_index._own_index(folder, build) == {"t": 2}
    for kept in (tmp_path / "cache").glob("*.pickle"):
        kept.write_bytes(b"not a pickle")                                           # corrupt: built again
    assert task_index._own_index(folder, build) == {"t": 3}
    assert task_index._own_index(folder, build) == {"t": 3}
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_an_unwritable_cache_only_costs_the_build(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the folder would be")
    monkeypatch.setenv("FASTDLLM_CACHE_DIR", str(tmp_path / "cache" / "fastdllm"))
    assert task_index._own_index(tmp_path, lambda paths: {"t": 1}) == {"t": 1}


@pytest.mark.slow
def test_a_manager_from_the_kept_index_is_lm_evals_own():
    """lm-eval's own TaskManager (every YAML parsed) against ours (its own folder from the kept
    index, which the first call of a run may build), with a local include path on top."""
    from lm_eval.tasks import TaskManager

    ours = task_index.build_manager([str(TASKS)], True)
    theirs = TaskManager(include_path=[str(TASKS)])
    for names in ("all_tasks", "all_subtasks", "all_groups", "all_tags"):
        assert getattr(ours, names) == getattr(theirs, names)
    entry = lambda e: (e.name, e.kind.name, str(e.yaml_path), e.cfg, e.tags)   # noqa: E731
    assert {k: entry(e) for k, e in ours.task_index.items()} == {k: entry(e) for k, e in theirs.task_index.items()}
    assert "tiny_next_line" in ours.all_tasks and "gsm8k" in ours.all_tasks
    from lm_eval.tasks import _index

    assert _index.TaskIndex.build is not None and "cached_build" not in repr(_index.TaskIndex.build)
