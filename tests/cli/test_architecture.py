"""The layout is the architecture (docs/architecture.md): imports run downwards only, no consumer
imports a sibling consumer, no import circles, the modules read by `--help` and flag checks
never import torch, and the doc names every module. Read from the source files' own import
statements (ast), not by importing."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastdllm

PACKAGE = Path(fastdllm.__file__).resolve().parent
CLI = PACKAGE / "cli" if (PACKAGE / "cli").is_dir() else PACKAGE.parent / "cli"   # installed / checkout
DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

# layer of each top-level part of fastdllm; a module may import its own part or a lower layer
LAYERS = {"errors": 0, "units": 0, "thread_watch": 0, "source_tree": 0, "cache_folder": 0, "host_memory": 0, "code_execution": 0, "threads": 1, "models": 1, "decode": 2, "training": 2, "checkpoints": 3,
          "bench": 4, "eval": 4, "serve": 4, "terminal": 4, "testing": 4, "cli": 5}
TORCH_FREE = ["fastdllm.cli.app", "fastdllm.source_tree", "fastdllm.decode.rules", "fastdllm.decode.cache_modes", "fastdllm.decode.config", "fastdllm.decode.config_values",
              "fastdllm.decode.profiles", "fastdllm.decode.family_defaults", "fastdllm.checkpoints.placement", "fastdllm.checkpoints.split",
              "fastdllm.checkpoints.fit_split",
              "fastdllm.checkpoints.locate", "fastdllm.threads", "fastdllm.thread_watch",
              "fastdllm.host_memory"]


def modules() -> dict[str, Path]:
    found = {}
    for root, prefix in ((PACKAGE, "fastdllm"), (CLI, "fastdllm.cli")):
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("").parts
            if rel[0] == "cli" and root == PACKAGE:
                continue
            parts = [prefix, *rel]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The fastdllm modules `name` imports (module-level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("fastdllm")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("fastdllm"):
                continue
            for a in node.names:                       # `from pkg import module` names a module
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known and m != name}


def part(name: str) -> str:
    return name.split(".")[1] if name.count(".") else "fastdllm"


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_every_part_of_the_package_has_a_layer():
    # __main__: `python -m fastdllm` (the launchers' -m), the command and nothing else
    assert {part(m) for m in graph()} - {"fastdllm", "builtin_profiles", "__main__"} == set(LAYERS)


def test_imports_run_downwards_and_never_to_a_sibling():
    wrong = []
    for source, targets in graph().items():
        for target in targets:
            a, b = part(source), part(target)
            if a != b and a in LAYERS and b in LAYERS and LAYERS[b] >= LAYERS[a]:
                wrong.append(f"{source} -> {target}")
    assert wrong == []


def test_no_import_circles():
    edges, state, circles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_help_and_flag_checks_never_import_torch(tmp_path):
    code = f"import sys; import {', '.join(TORCH_FREE)}; print(sorted({{'torch', 'transformers'}} & set(sys.modules)))"
    # outside the checkout: there `python -c` would import its source tree, which has no fastdllm.cli
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.strip() == "[]"


def module_paths() -> set[str]:
    """Every module as docs/architecture.md names it: its path in the package (`decode/step.py`),
    the CLI's under `cli/`."""
    found = set()
    for root, prefix in ((PACKAGE, ""), (CLI, "cli/")):
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if root == PACKAGE and rel.split("/")[0] in ("cli", "builtin_profiles"):
                continue
            found.add(prefix + rel)
    return found


@pytest.mark.skipif(not DOC.is_file(), reason="docs/ is in a checkout only")
def test_the_architecture_doc_names_every_module_and_no_other():
    doc = DOC.read_text(encoding="utf-8")
    modules = module_paths()
    # the whole path: `errors.py` inside `cli/user_errors.py` or `models/__init__.py` names neither
    unnamed = [m for m in modules if not re.search(rf"(?<![\w./]){re.escape(m)}(?!\w)", doc)]
    assert sorted(unnamed) == []
    folders = {m.split("/")[0] for m in modules if "/" in m}
    # a path named in the doc under one of the package's folders is a module that exists
    stale = {p for p in re.findall(r"`([\w/]+\.py)`", doc) if p.split("/")[0] in folders and "/" in p}
    assert sorted(stale - modules) == []
