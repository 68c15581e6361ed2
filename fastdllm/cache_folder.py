"""fastdllm's cache folder: FASTDLLM_CACHE_DIR, else $XDG_CACHE_HOME/fastdllm, else
~/.cache/fastdllm. It holds what is slow to find out and changes only with the machine or the
installed packages: the CPU dtype probe's figures (checkpoints/cpu_dtype.py) and lm-eval's task
index (eval/task_index.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder() -> Path:
    if os.environ.get("FASTDLLM_CACHE_DIR"):
        return Path(os.environ["FASTDLLM_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastdllm"
