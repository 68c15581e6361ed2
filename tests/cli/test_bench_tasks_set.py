"""bench's `tasks` prompt set (the built-in model's graded tasks) and the set a model declares."""

from __future__ import annotations

import json

from fastdllm.bench import prompts


def test_tasks_alternate_word_problems_and_function_tasks_and_grade_them():
    tasks = prompts.builtin("tasks").take(4)
    assert tasks.prompts[0].startswith("Question: ") and tasks.prompts[0].endswith("\nAnswer:")
    assert tasks.prompts[1].startswith("def ")
    problem, task = tasks.references[0], tasks.references[1]
    right = [f" Some steps.\n#### {problem:,}", task["canonical_solution"], " #### 0", "    return None\n"]
    assert tasks.quality(right) == 0.5                         # the reference answers pass, the wrong ones fail
    assert prompts.task_passes(tasks.prompts[0], f"\n#### {problem}", problem)
    assert not prompts.task_passes(tasks.prompts[0], f"{problem}", problem)   # strict: after ####


def test_a_model_declares_its_set_else_chat_or_code(tmp_path):
    assert prompts.default_set(tmp_path, chat=True) == "chat"
    assert prompts.default_set(tmp_path, chat=False) == "code"
    (tmp_path / "generation_config.json").write_text(json.dumps({"fastdllm_prompt_set": "tasks"}))
    assert prompts.default_set(tmp_path, chat=True) == "tasks"
    (tmp_path / "generation_config.json").write_text(json.dumps({"fastdllm_prompt_set": "nonsense"}))
    assert prompts.default_set(tmp_path, chat=False) == "code"
