"""The built-in lm-eval tasks (fastdllm/eval/builtin_tasks/): found without --include-path from any
folder, their data as the generators make it, gsm8k-style answer extraction, and pass@1's guarded
runner (fastdllm/code_execution.py)."""

from __future__ import annotations

import importlib.util
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from fastdllm.eval.builtin_tasks import FOLDER, hooks
from fastdllm.code_execution import passes

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["tiny-gsm", "tiny-code", "tiny-gsm-others"]
OTHERS = FOLDER / "tiny_gsm_others.jsonl"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FOLDER / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The three tasks as lm-eval builds them, asked for from a folder that is not the repository."""
    pytest.importorskip("lm_eval")
    import os

    from lm_eval.tasks import get_task_dict

    from fastdllm.eval.tasks import task_manager

    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("elsewhere"))
    try:
        manager = task_manager([], TASKS)
        assert set(TASKS) <= set(manager.all_tasks)
        assert len(manager.all_tasks) < 100          # the fast path: lm-eval's own ~14k tasks not indexed
        asked = TASKS if OTHERS.is_file() else TASKS[:2]
        # loads the data (custom_dataset) from here too; TaskManager.load where this lm-eval has it
        tasks = manager.load(asked)["tasks"] if hasattr(manager, "load") else get_task_dict(asked, manager)
        yield SimpleNamespace(manager=manager, tasks=tasks)
    finally:
        os.chdir(here)


def test_tasks_load_from_any_folder(loaded):
    gsm, code = loaded.tasks["tiny-gsm"], loaded.tasks["tiny-code"]
    assert len(gsm.eval_docs) == 200 and len(code.eval_docs) == 164
    doc = gsm.eval_docs[0]
    assert gsm.doc_to_text(doc) == f"Question: {doc['question']}\nAnswer:"     # mixture.gsm_prompt's string
    assert gsm.doc_to_target(doc) == doc["target"]
    assert [f.name for f in gsm._filters] == ["strict-match", "flexible-extract"]
    assert gsm.config.generation_kwargs["until"] == ["Question:", "</s>", "<|im_end|>"]
    assert code.doc_to_text(code.eval_docs[0]) == code.eval_docs[0]["prompt"]
    assert code.config.generation_kwargs["until"] == ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
    for task in (gsm, code):
        assert task.config.generation_kwargs["max_gen_toks"] == 256


def test_others_task_data(loaded):
    if not OTHERS.is_file():
        pytest.skip(f"{OTHERS.name} is not written yet (hand-written; the YAML is there)")
    others = loaded.tasks["tiny-gsm-others"]
    assert len(others.eval_docs) > 0
    for doc in others.eval_docs:
        assert hooks.strict_answer(doc["answer"]) == doc["target"], doc["question"]


def test_data_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("make_builtin_tasks", ROOT / "scripts" / "make_builtin_tasks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for name, text in script.files().items():
        assert (FOLDER / name).read_text(encoding="utf-8") == text, f"{name} is stale: python scripts/make_builtin_tasks.py"


def test_gold_answers_score_one(loaded, tmp_path, monkeypatch):
    """Through lm-eval itself (filters, exact_match against `target`, process_results): a model that
    answers with the reference answers scores 1 on every metric."""
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM

    monkeypatch.chdir(tmp_path)
    gsm, code = loaded.tasks["tiny-gsm"], loaded.tasks["tiny-code"]
    gold = {gsm.doc_to_text(d): " " + d["answer"] for d in gsm.eval_docs}
    gold.update({d["prompt"]: d["canonical_solution"] for d in code.eval_docs})

    class Gold(LM):
        def generate_until(self, requests):
            return [gold[r.args[0]] for r in requests]

        def loglikelihood(self, requests):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

    out = simple_evaluate(model=Gold(), tasks=["tiny-gsm", "tiny-code"], task_manager=loaded.manager, limit=4,
                          log_samples=False, verbosity="ERROR")
    results = out["results"]
    assert results["tiny-gsm"]["exact_match,strict-match"] == results["tiny-gsm"]["exact_match,flexible-extract"] == 1
    assert results["tiny-code"]["pass@1,none"] == 1

@pytest.mark.parametrize("text, strict, flexible", [
    ("So 1000 + 234 = 1234.\n#### 1,234", "1234", "1234"),
    ("It costs 3 * 4 = $12.\n#### $12", "12", "12"),
    ("#### -7\nQuestion: more", "-7", "-7"),
    ("She has 3 + 4 = 7 apples, then 7 * 2 = 14.", hooks.INVALID, "14"),
    ("The answer is 1,234.", hooks.INVALID, "1234"),
    ("#### 5\nand then 9 more", "5", "9"),            # strict: the first ####; flexible: the last number
    ("no numbers here", hooks.INVALID, hooks.INVALID),
])
def test_gsm_extraction(text, strict, flexible):
    assert hooks.strict_answer(text) == strict
    assert hooks.flexible_answer(text) == flexible
    assert hooks.strict_numbers([[text]], [{}]) == [[strict]]
    assert hooks.flexible_numbers([[text]], [{}]) == [[flexible]]


def test_gsm_gold_answers_grade_right():
    for doc in rows("tiny_gsm.jsonl"):
        assert hooks.strict_answer(doc["answer"]) == doc["target"] == hooks.flexible_answer(doc["answer"])


def test_canonical_solutions_pass():
    """All 164 reference bodies through the pass@1 metric (two at a time: ~0.07 s a child process),
    and one wrong body that fails."""
    docs = rows("tiny_code.jsonl")
    with ThreadPoolExecutor(2) as pool:
        scores = list(pool.map(lambda d: hooks.code_results(d, [d["canonical_solution"]]), docs))
    failed = [d["task_id"] for d, s in zip(docs, scores) if s != {"pass@1": 1.0}]
    assert not failed
    doc = docs[0]
    assert hooks.code_results(doc, ["    return None\n"]) == {"pass@1": 0.0}
    assert passes(hooks.program(doc, "    return None\n"), timeout=5) == (False, "failed: AssertionError")


def test_infinite_loop_times_out():
    assert passes("while True:\n    pass\n", timeout=1) == (False, "timed out")


def test_writes_outside_the_folder_are_refused(tmp_path):
    target = tmp_path / "written.txt"
    for program in (f"open({str(target)!r}, 'w').write('x')",
                    f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
                    f"import os\nos.system('touch {target}')",
                    f"import shutil\nshutil.rmtree({str(tmp_path)!r})"):
        assert passes(program, timeout=5) == (False, "failed: PermissionError"), program
        assert not target.exists() and tmp_path.is_dir()
    # inside its own folder a program may write and remove files
    assert passes("open('scratch.txt', 'w').write('x')\nimport os\nos.remove('scratch.txt')\n", timeout=5)[0]


def test_sockets_are_refused():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}))\n"
        assert passes(program, timeout=5) == (False, "failed: PermissionError")
        with pytest.raises(socket.timeout):
            listener.accept()                      # no connection was made
    finally:
        listener.close()


def test_exits_and_crashes_do_not_pass():
    assert passes("import sys\nsys.exit(0)\n", timeout=5) == (False, "failed: SystemExit")
    assert passes("import os\nos._exit(0)\n", timeout=5) == (False, "failed: exited early")
    assert passes("def f(:\n", timeout=5) == (False, "failed: SyntaxError")


def test_missing_data_is_one_line():
    from fastdllm.errors import UserError

    with pytest.raises(UserError, match="missing"):
        hooks.load_docs("absent.jsonl", version=1.0)
