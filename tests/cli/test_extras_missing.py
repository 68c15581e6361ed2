"""Every command that needs an optional extra names it in one line when the extra is not installed
(issue 50, 1): each command runs in a process where the extra's modules cannot be found, as after
`pip install fastdllm` alone. A sitecustomize first on PYTHONPATH hides them from the import system
(`import` and importlib.util.find_spec then find nothing, as when they are absent), which is much
faster than a venv per extra. The README's eval example finds its data from any folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastdllm.cli.user_errors import EXTRAS, needs_extra

ROOT = Path(__file__).resolve().parents[2]

HIDE = '''import os, sys
from importlib.machinery import PathFinder
HIDDEN = set(os.environ["FASTDLLM_TEST_HIDE"].split(","))
class Hidden(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in HIDDEN else PathFinder.find_spec(name, path, target)
sys.meta_path[:] = [Hidden if f is PathFinder else f for f in sys.meta_path]
'''

# (extra, the modules hidden, the command, what the line says); each line names the extra
CASES = [
    ("eval", "lm_eval", ["eval", "--tasks", "tiny-gsm", "--limit", "1"], "fastdllm eval needs lm_eval"),
    ("eval", "lm_eval", ["eval", "--tasks", "tiny-gsm", "--num-processes", "2"], "fastdllm eval needs lm_eval"),
    ("serve", "fastapi", ["serve", "--port", "0"], "fastdllm serve needs fastapi"),
    ("serve", "uvicorn", ["serve", "--port", "0"], "fastdllm serve needs uvicorn"),
    ("serve", "prometheus_client", ["serve", "--port", "0"], "fastdllm serve needs prometheus_client"),
    ("plot", "matplotlib", ["analyze", "def f(x):", "-o", "{tmp}/a.html"], "analyze draws with matplotlib"),
    ("plot", "matplotlib", ["bench", "--plot", "{tmp}/p.png", "--prompt-set", "code"], "--plot needs matplotlib"),
    ("structured", "llguidance", ["generate", "--regex", "[0-9]+", "x = "], "structured output needs llguidance"),
    ("structured", "llguidance", ["chat", "--regex", "[0-9]+"], "structured output needs llguidance"),
    ("quant", "bitsandbytes", ["generate", "--quantize", "4bit", "x = "], "--quantize 4bit needs bitsandbytes"),
]


def run_without(modules: str, args: list[str], tmp_path: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "hide").mkdir(exist_ok=True)
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "FASTDLLM_TEST_HIDE": modules,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "hide"), os.environ.get("PYTHONPATH")]))}
    env.pop("FASTDLLM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fastdllm", *[a.format(tmp=tmp_path) for a in args]], cwd=cwd or tmp_path,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def one_line(r: subprocess.CompletedProcess) -> str:
    """The error line: the last on stderr, the only one, no traceback (eval's progress may precede it)."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert r.returncode == 1 and errors == lines[-1:], r.stderr[-3000:]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("extra,modules,args,says", CASES, ids=[f"{c[0]}-{c[2][0]}-{c[1]}-{len(c[2])}" for c in CASES])
def test_a_command_without_its_extra_names_it_in_one_line(extra, modules, args, says, tmp_path):
    line = one_line(run_without(modules, args, tmp_path))
    assert says in line and f"fastdllm[{extra}]" in line, line


def test_every_extra_named_is_one_pyproject_declares():
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(declared)
    assert set(EXTRAS.values()) >= set(declared) - {"test"}        # every extra has its modules here


def test_a_missing_module_of_an_extra_is_one_line_and_any_other_stays_a_bug():
    line = needs_extra("lm_eval.tasks", "eval")
    assert line == "fastdllm eval needs lm_eval, from the `eval` extra: pip install 'fastdllm[eval]'"
    assert needs_extra("nosuch", "eval") is None


@pytest.mark.slow
def test_the_readme_eval_example_finds_its_data_from_another_folder(tmp_path):
    r = run_without("", ["eval", "--include-path", str(ROOT / "examples" / "eval"), "--tasks", "next_line",
                         "--profiles", "baseline", "--limit", "1", "--format", "csv"], tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.splitlines()[1].startswith("next_line,baseline"), r.stdout


@pytest.mark.slow
def test_a_task_whose_data_file_is_missing_is_one_line_naming_it(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    yaml = (ROOT / "examples" / "eval" / "next_line.yaml").read_text()
    (tasks / "gone.yaml").write_text(yaml.replace("task: next_line", "task: gone")
                                     .replace('dataset_path: ""', "dataset_path: json")
                                     .replace("custom_dataset: !function hooks.load_docs\n", "")
                                     .replace("data_file: next_line.jsonl", "data_files:\n    test: gone.jsonl"))
    line = one_line(run_without("", ["eval", "--include-path", str(tasks), "--tasks", "gone", "--limit", "1"], tmp_path))
    assert line.startswith("error: task gone: its data cannot be found") and str(tmp_path / "gone.jsonl") in line, line
    (tasks / "hooks.py").write_text((ROOT / "examples" / "eval" / "hooks.py").read_text())
    (tasks / "gone.yaml").write_text(yaml.replace("task: next_line", "task: gone"))
    line = one_line(run_without("", ["eval", "--include-path", str(tasks), "--tasks", "gone", "--limit", "1"], tmp_path))
    assert line.startswith("error: the task's data ") and str(tasks / "next_line.jsonl") in line, line
