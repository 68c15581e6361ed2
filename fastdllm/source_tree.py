"""A source checkout imported as the package: `python -m fastdllm` in the repository root (as
`torchrun -m fastdllm` and `accelerate launch -m fastdllm` run it) imports the `fastdllm/` folder
there, whose commands live in the top-level `cli/` and profiles in `profiles/`. pyproject.toml's
package-dir maps those to `fastdllm.cli` and `fastdllm.builtin_profiles` in an install; this finder
maps them the same way in a checkout, so the whole run comes from that one tree. Torch-free."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

FOLDERS = {"fastdllm.cli": "cli", "fastdllm.builtin_profiles": "profiles"}   # as pyproject.toml's package-dir


class SourceFolders(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        folder = FOLDERS.get(name)
        if folder is None:
            return None
        init = self.root / folder / "__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])


def map_checkout(package_dir: Path) -> None:
    """Map the checkout's folders if `package_dir` is the `fastdllm/` of a source checkout (an
    installed package has its own `cli/`; an editable install's finder already maps them)."""
    root = package_dir.parent
    if (package_dir / "cli").is_dir() or not (root / "cli" / "app.py").is_file() \
            or not (root / "pyproject.toml").is_file():
        return
    if not any(isinstance(f, SourceFolders) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFolders(root))
