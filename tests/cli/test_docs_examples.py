"""The README and the guides say what is true: every `fastdllm` command they show (in shell
examples and in inline code) parses with the flags it names, and every shell example runs and
exits 0, in a fresh directory beside the repository's `examples/`. An example may be marked, on
the line before its fence, `<!-- example: network -->` (it downloads: packages, a hub
checkpoint), `<!-- example: gpu -->`, `<!-- example: ci -->` (the test command itself, which CI
runs) or `<!-- example: server -->` (run while `fastdllm serve` listens on 127.0.0.1:8000)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
SHELLS = ("bash", "console", "sh", "shell")
MARKS = {"network", "gpu", "ci", "server"}
FENCE = "`" * 3


@dataclass
class Example:
    doc: str
    line: int
    lang: str
    body: list[str]
    mark: str | None

    @property
    def commands(self) -> list[str]:
        """The example's shell lines, continuations joined (console: the `$ ` lines only)."""
        lines = [x[2:] for x in self.body if x.startswith("$ ")] if self.lang == "console" else \
            [x for x in self.body if x.strip() and not x.lstrip().startswith("#")]
        joined, out = "", []
        for x in lines:
            joined += x.rstrip("\\").rstrip() + " " if x.rstrip().endswith("\\") else x
            if not x.rstrip().endswith("\\"):
                out.append(joined.strip())
                joined = ""
        return out


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(rf"^{FENCE}(\w*)\s*$", lines[i])
            if m:
                j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(FENCE))
                marked = re.match(r"<!-- example: (\w+) -->", lines[i - 1]) if i else None
                if m.group(1) in SHELLS:
                    found.append(Example(doc.relative_to(ROOT).as_posix(), i + 1, m.group(1), lines[i + 1:j],
                                         marked.group(1) if marked else None))
                i = j
            i += 1
    return found


EXAMPLES = examples()


REDIRECTS = {">", ">>", "<", "2>", "&>"}


def fastdllm_invocations(command: str) -> list[list[str]]:
    """The argument lists of every `fastdllm ...` in a shell line: the command itself or a
    launcher's `-m fastdllm` (pipes, `&&` and redirections split it; $'...' strings become plain
    ones)."""
    command = re.sub(r"\$'((?:[^'\\]|\\.)*)'", lambda m: shlex.quote(m.group(1)), command)
    out = []
    for part in re.split(r"\s*(?:&&|\|\||\||;)\s*", command):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            continue
        kept, skip = [], False
        for w in words:
            if skip or w in ("2>&1",):
                skip = False
                continue
            if w in REDIRECTS:
                skip = True
                continue
            if not re.match(r"^(\d?>|<)", w):
                kept.append(w)
        at = [i for i, w in enumerate(kept) if w == "fastdllm" and (i == 0 or kept[i - 1] == "-m")]
        out += [kept[i + 1:] for i in at]
    return out


def command_of(args: list[str]):
    """(the click command an argument list names, its remaining arguments)."""
    from typer.main import get_command

    from fastdllm.cli.app import app

    sub, rest = get_command(app).get_command(None, args[0]), args[1:]
    if hasattr(sub, "list_commands") and rest and not rest[0].startswith("-"):     # a group: its subcommand
        sub, rest = sub.get_command(None, rest[0]), rest[1:]
    return sub, rest


def inline_commands() -> list[tuple[str, str]]:
    """`fastdllm ...` in inline code: prose that names a command and its flags, often a fragment."""
    return [(doc.relative_to(ROOT).as_posix(), code) for doc in DOCS
            for code in re.findall(r"`(fastdllm [a-z][^`]*)`", doc.read_text())]


def test_the_docs_have_examples_and_only_known_marks():
    assert len(EXAMPLES) >= 20
    assert {e.mark for e in EXAMPLES} - {None} <= MARKS
    assert sum(e.mark is None for e in EXAMPLES) >= 10


@pytest.mark.parametrize("where, command", [(f"{e.doc}:{e.line}", c) for e in EXAMPLES for c in e.commands])
def test_every_fastdllm_command_in_an_example_parses(where, command):
    """Every flag an example names exists and takes what it is given (parsed, not run)."""
    try:
        from typer._click import exceptions     # typer's own click (0.2x): its commands raise these
    except ImportError:
        from click import exceptions

    for args in fastdllm_invocations(command):
        sub, rest = command_of(args)
        assert sub is not None, f"{where}: no command {args[0]!r} in {command!r}"
        try:
            sub.make_context(args[0], list(rest))
        except exceptions.Exit:
            pass
        except exceptions.UsageError as e:
            pytest.fail(f"{where}: {command!r}: {e.format_message()}")


@pytest.mark.parametrize("where, code", inline_commands())
def test_every_flag_named_in_the_prose_exists(where, code):
    for args in fastdllm_invocations(code):
        sub, rest = command_of(args)
        assert sub is not None, f"{where}: no command {args[0]!r} in {code!r}"
        known = {opt for param in sub.params for opt in (*param.opts, *param.secondary_opts)}
        named = {w.split("=")[0] for w in rest if w.startswith("-") and w != "-"}
        assert named <= known, f"{where}: {code!r} names {sorted(named - known)}, which {args[0]} does not take"


def run_example(example: Example, cwd: Path) -> subprocess.CompletedProcess:
    script = "set -e\n" + "\n".join(example.commands) + "\n"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def sandbox(tmp_path):
    """A fresh directory that holds what the docs refer to as relative paths."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.mark in (None, "server")],
                         ids=lambda e: f"{e.doc}:{e.line}")
def test_every_shell_example_runs(example, sandbox):
    if any(c.startswith("fastdllm serve") for c in example.commands):     # a server: it must start, then stop
        server = start_server(shlex.split(example.commands[0], comments=True), sandbox)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        return
    server = start_server(["fastdllm", "serve", "--port", "8000"], sandbox) if example.mark == "server" else None
    try:
        done = run_example(example, sandbox)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    assert done.returncode == 0, f"{example.doc}:{example.line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr


def start_server(args: list[str], cwd: Path, seconds: float = 120) -> subprocess.Popen:
    """The command's server, once it answers /health (its log names the address)."""
    import httpx

    command = [str(Path(sys.executable).with_name(args[0])), *args[1:]]
    server = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.time() + seconds
    while time.time() < deadline:
        line = server.stderr.readline()
        if not line and server.poll() is not None:
            raise AssertionError(f"the server ended with {server.returncode}")
        if found := re.search(r"fastdllm serve: (http://\S+)/v1", line):
            while httpx.get(found.group(1) + "/health", timeout=10).status_code != 200:
                time.sleep(0.1)
            threading.Thread(target=server.stderr.read, daemon=True).start()    # keep its pipe drained
            return server
    server.kill()
    raise AssertionError("the server did not start")
