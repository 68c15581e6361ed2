"""Start-up and exit (issue 50, 5): on a terminal the loading line is up before torch is imported
(torch and transformers are most of a small model's start), and a finished command leaves without
the interpreter's last collections over torch's objects (gc.freeze in cli/app.py), losing nothing.
Order and effect are tested, not seconds: the figures are in the closing note."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastdllm.testing.pty_run import run_on_pty

# a sitecustomize that says on stderr when torch is first looked for, so that the order of what a
# terminal shows can be read from the output alone
TORCH_MARK = '''import os, sys
class Mark:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "torch":
            os.write(2, b"<torch import>")
            sys.meta_path.remove(Mark)
        return None
sys.meta_path.insert(0, Mark)
'''


def on_a_terminal(args: list[str], cwd: Path, env: dict, timeout: float = 300) -> tuple[int, str]:
    """Run `python -m fastdllm ARGS` with stdin, stdout and stderr on a pty: (exit code, output)."""
    run = run_on_pty([sys.executable, "-m", "fastdllm", *args], cwd=cwd, env=env, timeout=timeout)
    return run.code, run.output


@pytest.mark.slow
def test_a_terminal_sees_the_loading_line_before_torch_is_imported(tmp_path):
    (tmp_path / "mark").mkdir()
    (tmp_path / "mark" / "sitecustomize.py").write_text(TORCH_MARK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "mark"), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "100", "LINES": "30"}
    code, out = on_a_terminal(["generate", "-n", "32", "-q", "def add(a, b):"], tmp_path, env)
    assert code == 0, out[-2000:]
    assert "loading " in out and "<torch import>" in out, out[:2000]          # "loading tiny-code ..."
    assert out.index("loading ") < out.index("<torch import>"), out[:2000]


@pytest.mark.slow
def test_a_finished_command_freezes_its_objects_for_a_quick_exit_and_loses_nothing(tmp_path):
    # the atexit hook runs after main() has returned: gc is frozen by then, and every hook still runs
    code = ("import atexit, gc, sys; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, "
            "file=sys.stderr)); sys.argv = ['fastdllm', 'generate', '--json', '-n', '32', 'def add(a, b):']; "
            "from fastdllm.cli.app import main; main()")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["nfe"] > 0                  # the whole JSON object, flushed
    assert r.stderr.strip().endswith("frozen True"), r.stderr[-2000:]


def test_a_user_error_also_leaves_through_the_quick_exit(tmp_path):
    code = ("import atexit, gc, sys; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, "
            "file=sys.stderr)); sys.argv = ['fastdllm', 'profiles', 'show', 'nosuch']; "
            "from fastdllm.cli.app import main; main()")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nosuch" in r.stderr and r.stderr.strip().endswith("frozen True"), r.stderr
