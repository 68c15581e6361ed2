"""Tiny checkpoints in the exact published layouts (random weights), built once per session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny import WRITERS
from fastdllm.testing.tiny_random import FIXTURES  # real published non-weight files

# --dtype auto on a CPU follows the CPU (checkpoints/cpu_dtype.py): bf16 on AMX or where a probe
# finds it faster. The suite pins it to fp32, so that its exactness tolerances and expected texts
# hold alike on every CI machine class; tests/quant/test_cpu_dtype.py unpins it to test the choice.
os.environ.setdefault("FASTDLLM_CPU_DTYPE", "fp32")
# fastdllm's cache folder (lm-eval's task index, fastdllm/eval/task_index.py) out of the user's
# home, shared by the workers, their subprocesses and later runs on this machine.
os.environ.setdefault("FASTDLLM_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"fastdllm-tests-cache-{os.getuid()}"))

# Sharper-than-usual random weights: varied tokens and confidences (median ~0.7), so that the
# threshold and factor rules commit several tokens in some steps and one in others.
VARIED = dict(init_std=0.3, logit_scale=2.0, fixtures=FIXTURES)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny float64 ops: threads only add overhead (and contend with other processes)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """`tiny(family, **overrides) -> Path`: the tiny checkpoint `WRITERS[family](out, **overrides)` writes
    (fastdllm/testing/tiny.py), written once per session (per xdist worker) for each distinct family and
    overrides, compared by value. For tests that only read the folder: one that edits it writes its own."""
    written: dict[tuple[str, str], Path] = {}

    def write(family: str, **overrides) -> Path:
        key = (family, repr(sorted(overrides.items())))
        if key not in written:
            out = tmp_path_factory.mktemp(f"tiny-{family}") / f"tiny-{family.replace('_', '-')}"
            written[key] = WRITERS[family](out, **overrides)
        return written[key]

    return write


@pytest.fixture(scope="session")
def llada_dir(tiny):
    return tiny("llada", **VARIED)


@pytest.fixture(scope="session")
def dream_dir(tiny):
    # Dream's vocabulary is 152k: a larger head scale gives the same spread of confidences
    return tiny("dream", **dict(VARIED, logit_scale=4.0))


@pytest.fixture(scope="session")
def llada64(llada_dir):
    return loading.load(llada_dir, dtype="fp64")


@pytest.fixture(scope="session")
def dream64(dream_dir):
    return loading.load(dream_dir, dtype="fp64")


# The same checkpoints with a mask row that takes real probability (tests/mask_heavy.py): exactness
# must not depend on p(mask) being ~0.
HEAVY_PROMPT = "Write a function that adds two numbers."


def _heavy(lm, tmp_path_factory):
    from mask_heavy import heavy_copy

    canvas = lm.encode(HEAVY_PROMPT, chat=True) + [lm.specials.mask] * 32
    return heavy_copy(lm, tmp_path_factory.mktemp("heavy") / lm.path.name, canvas)


@pytest.fixture(scope="session")
def llada64_heavy_mask(llada64, tmp_path_factory):
    return _heavy(llada64, tmp_path_factory)


@pytest.fixture(scope="session")
def dream64_heavy_mask(dream64, tmp_path_factory):
    return _heavy(dream64, tmp_path_factory)


def pytest_configure(config):
    """Under pytest-xdist (`-n N`), each worker takes its share of the cores for torch's threads, so
    that N workers do not each start a pool as wide as the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    """The fast lane (`pytest -m fast`, README): every test not marked `slow`. A test is marked slow
    when it starts processes or servers, or sweeps a grid another test already covers by one point.
    A parametrized test marked `sweep` keeps its first case in the fast lane and runs the rest in
    the full suite only: the lane touches every test function, the suite every point."""
    seen = set()
    for item in items:
        if item.get_closest_marker("sweep") is not None:
            function = (item.nodeid.split("[")[0])
            if function in seen:
                item.add_marker(pytest.mark.slow)
            seen.add(function)
        if item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)
