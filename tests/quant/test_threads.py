"""fastdllm/threads.py: the thread count (physical cores in the affinity mask, the user's variables)
and OpenMP's waiting, seen by the OpenMP runtime itself (OMP_DISPLAY_ENV=verbose). The count
following the free cores: tests/quant/test_thread_watch.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastdllm import threads
from fastdllm.errors import UsageError


def fake_sysfs(root, cores: dict[int, tuple[int, int]]):
    for cpu, (package, core) in cores.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


def test_physical_cores_count_smt_siblings_once_within_the_affinity_mask(tmp_path):
    # two packages, two cores each, two SMT threads per core: logical 0-7
    sysfs = fake_sysfs(tmp_path / "cpu", {c: (c // 4, (c % 4) % 2) for c in range(8)})
    assert threads.physical_cores(list(range(8)), sysfs) == 4
    assert threads.physical_cores([0, 2], sysfs) == 1              # siblings of one core
    assert threads.physical_cores([0, 1, 4], sysfs) == 3           # same core id, other package


def test_cpuinfo_then_the_logical_count_when_sysfs_is_missing(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("".join(f"processor\t: {c}\nphysical id\t: 0\ncore id\t\t: {c // 2}\nflags\t\t: avx\n\n"
                            for c in range(4)))
    assert threads.physical_cores([0, 1, 2, 3], tmp_path / "none", info) == 2
    assert threads.physical_cores([1, 2], tmp_path / "none", info) == 2
    assert threads.physical_cores([0, 1, 2], tmp_path / "none", tmp_path / "nothing") == 3


def test_cgroup_quota_caps_whole_cpus(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert threads.cpu_quota(cpu_max) is None
    cpu_max.write_text("150000 100000\n")
    assert threads.cpu_quota(cpu_max) == 2
    assert threads.cpu_quota(tmp_path / "absent") is None


def test_the_users_count_wins_and_a_bad_one_is_one_line():
    assert threads.decide({"FASTDLLM_THREADS": "3", "OMP_NUM_THREADS": "5"}) == (3, "FASTDLLM_THREADS")
    assert threads.decide({"OMP_NUM_THREADS": "5"}) == (5, "OMP_NUM_THREADS")
    assert threads.decide({"OMP_NUM_THREADS": "4,2"}) == (0, "OMP_NUM_THREADS")      # OpenMP's own syntax
    assert threads.decide({}) == (threads.default_threads(), "physical cores")
    assert 1 <= threads.default_threads() <= len(os.sched_getaffinity(0))
    with pytest.raises(UsageError, match="FASTDLLM_THREADS=two: expected a whole number"):
        threads.decide({"FASTDLLM_THREADS": "two"})


def test_configure_writes_openmp_variables_only_before_torch_and_keeps_the_users():
    user = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "5"}
    assert threads.configure(user) == 5 and user == {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "5"}
    import torch

    before, env = torch.get_num_threads(), {}
    assert threads.configure(env) == threads.default_threads() and env == {}     # torch loaded: the caller's
    assert torch.get_num_threads() == before
    try:
        assert threads.configure({"FASTDLLM_THREADS": "1"}) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def openmp_sees(extra_env: dict) -> str:
    """What libgomp reports at load when a command runs, then torch loads (as in a command)."""
    code = ("from typer.testing import CliRunner\nfrom fastdllm.cli.app import app\n"
            "r = CliRunner().invoke(app, ['profiles', '--help'])\nassert r.exit_code == 0, r.output\n"
            "import torch\nprint('threads', torch.get_num_threads())\n"
            "from fastdllm import thread_watch\nprint('watch', thread_watch.WATCH is not None)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "FASTDLLM_"))}
    # PYTHONSAFEPATH: the installed package, not the checkout's fastdllm/ (which has no cli/ inside)
    done = subprocess.run([sys.executable, "-c", code],
                          env={**env, "PYTHONSAFEPATH": "1", "OMP_DISPLAY_ENV": "verbose", **extra_env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr + done.stdout


def test_openmp_spins_as_its_default_with_the_physical_cores_unless_told():
    """libgomp's own waiting (spin 300000 rounds, then sleep): thread_watch keeps the threads off
    busy cores instead of passive waiting, which cost a 0.5B step 2.4x on a quiet machine."""
    seen = openmp_sees({})
    assert "GOMP_SPINCOUNT = '300000'" in seen
    assert f"OMP_NUM_THREADS = '{threads.default_threads()}'" in seen
    assert f"threads {threads.default_threads()}" in seen and "watch True" in seen
    told = openmp_sees({"OMP_WAIT_POLICY": "ACTIVE", "FASTDLLM_THREADS": "1"})
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in told and "threads 1" in told and "watch False" in told


def test_a_bad_thread_count_stops_the_command_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTDLLM_")}
    done = subprocess.run([sys.executable, "-m", "fastdllm", "info"],
                          env={**env, "PYTHONSAFEPATH": "1", "FASTDLLM_THREADS": "0"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "error: FASTDLLM_THREADS=0: expected a whole number of threads >= 1"
