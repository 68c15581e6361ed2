"""lm-eval's TaskManager with the index of lm-eval's own tasks kept on disk between runs.

lm-eval parses every YAML file of its ~14k task files at each start (9-14 s on two cores) before
it can tell whether `gsm8k` exists. That folder changes only with lm-eval, so its index (name ->
Entry, what lm-eval's TaskIndex.build returns) is kept in fastdllm's cache folder, keyed by
lm-eval's version, the folder, and the count and newest modification time of its YAML files (a
walk of the folder, ~0.15 s), and read back (~1 s) while they are unchanged. Include paths (a
user's own tasks) are indexed afresh every time. With an lm-eval whose TaskManager is not built
on `lm_eval.tasks._index.TaskIndex` (older 0.4 releases), nothing is cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import threading
from pathlib import Path

from ..cache_folder import cache_folder

_PATCHING = threading.Lock()          # TaskIndex.build is swapped on the class while a manager is built


def build_manager(include_paths: list[str], defaults: bool):
    """lm-eval's TaskManager over `include_paths` (and its own tasks with `defaults`)."""
    from lm_eval.tasks import TaskManager

    with cached_index(defaults):
        return TaskManager(include_path=list(include_paths) or None, include_defaults=defaults)


@contextlib.contextmanager
def cached_index(wanted: bool = True):
    """Inside: lm-eval's TaskIndex.build reads lm-eval's own folder from the cache (lm-eval's
    TaskManager calls it; lm-eval's command line builds its manager itself)."""
    try:
        from lm_eval.tasks import _index
    except ImportError:
        _index = None
    if not wanted or _index is None or not hasattr(_index.TaskIndex, "build"):
        yield
        return
    own = Path(_index.__file__).resolve().parent
    build = _index.TaskIndex.build

    def cached_build(paths, *, resolve_includes=True):
        index = {}
        for root in paths:                  # later paths override earlier ones, as lm-eval merges them
            same = resolve_includes and Path(root).resolve() == own
            index.update(_own_index(own, build) if same else build([root], resolve_includes=resolve_includes))
        return index

    with _PATCHING:
        _index.TaskIndex.build = staticmethod(cached_build)
        try:
            yield
        finally:
            _index.TaskIndex.build = staticmethod(build)


def _own_index(folder: Path, build) -> dict:
    """lm-eval's own task index: from the cache while the folder is unchanged, else built and kept."""
    path = cache_folder() / f"lm-eval-tasks-{_fingerprint(folder)}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except Exception:                       # absent, stale format or corrupt: built again
        pass
    index = build([folder])
    try:                                    # atomically: parallel ranks may write at once
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(index))
        os.replace(tmp, path)
    except OSError:                         # an unwritable cache only costs the next run the build
        pass
    return index


def _fingerprint(folder: Path) -> str:
    """lm-eval's version, the folder, and its YAML files' count and newest modification time."""
    from importlib import metadata

    count, newest = 0, 0
    for directory, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".yaml"):
                count += 1
                newest = max(newest, os.stat(os.path.join(directory, name)).st_mtime_ns)
    try:
        version = metadata.version("lm-eval")
    except metadata.PackageNotFoundError:
        version = "unknown"
    text = f"{version}|{folder}|{count}|{newest}"
    return f"{version}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
