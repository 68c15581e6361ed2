"""How many CPU threads a run uses, and how idle threads wait: decided once at start-up, before
torch is imported (the OpenMP runtime reads its variables when it loads).

- Threads: FASTDLLM_THREADS, else OMP_NUM_THREADS, else the physical cores this process may run on
  (its affinity mask, counted as distinct (package, core) pairs, capped by a cgroup CPU quota).
  SMT siblings share one core's vector units, so a second thread per core only adds contention.
- Waiting: libgomp's own (idle workers spin for a while after each parallel region, then sleep),
  unless the user set OMP_WAIT_POLICY. A decode step has hundreds of short regions: passive waiting
  (a sleep and a wake-up per region) made a 0.5B DualCache step 2.4x slower on a quiet machine. The
  spinning would hold cores that another process needs, so where the thread count is ours to
  choose, thread_watch.py keeps the threads to the cores other processes leave free.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import thread_watch
from .errors import UsageError

SYSFS = Path("/sys/devices/system/cpu")
CPUINFO = Path("/proc/cpuinfo")
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")          # cgroup v2: "<quota> <period>" or "max <period>"


def allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int], sysfs: Path = SYSFS, cpuinfo: Path = CPUINFO) -> int:
    """Distinct physical cores among logical `cpus`: sysfs topology, else /proc/cpuinfo, else the
    logical count (a machine that tells neither)."""
    for read in (_cores_from_sysfs, _cores_from_cpuinfo):
        try:
            cores = read(cpus, sysfs if read is _cores_from_sysfs else cpuinfo)
        except (OSError, ValueError):
            continue
        if cores:
            return len(cores)
    return max(len(cpus), 1)


def _cores_from_sysfs(cpus: list[int], sysfs: Path) -> set:
    return {((sysfs / f"cpu{c}/topology/physical_package_id").read_text().strip(),
             (sysfs / f"cpu{c}/topology/core_id").read_text().strip()) for c in cpus}


def _cores_from_cpuinfo(cpus: list[int], cpuinfo: Path) -> set:
    cores, entry = set(), {}
    for line in cpuinfo.read_text().splitlines() + [""]:     # a blank line ends each processor
        key, _, value = line.partition(":")
        if key.strip():
            entry[key.strip()] = value.strip()
        elif entry:
            if int(entry["processor"]) in cpus and "core id" in entry:
                cores.add((entry.get("physical id", "0"), entry["core id"]))
            entry = {}
    return cores


def cpu_quota(path: Path = CPU_MAX) -> int | None:
    """Whole CPUs a cgroup quota allows (rounded up), None without a quota."""
    try:
        quota, period = path.read_text().split()
        return None if quota == "max" else max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


def default_threads() -> int:
    cores = physical_cores(allowed_cpus())
    quota = cpu_quota()
    return min(cores, quota) if quota else cores


def decide(environ=os.environ) -> tuple[int, str]:
    """(threads, where the number came from); a bad FASTDLLM_THREADS is a one-line usage error."""
    for name in ("FASTDLLM_THREADS", "OMP_NUM_THREADS"):
        text = environ.get(name, "").strip()
        if not text:
            continue
        if not text.isdigit() or int(text) < 1:
            if name == "OMP_NUM_THREADS":   # OpenMP's own syntax ("4,2" nesting): its business
                return 0, name
            raise UsageError(f"{name}={text}: expected a whole number of threads >= 1")
        return int(text), name
    return default_threads(), "physical cores"


def configure(environ=os.environ, watch: bool = False) -> int:
    """Set the thread count before torch loads (OMP_NUM_THREADS, which torch and its BLAS read);
    returns it (0: left to OpenMP's own OMP_NUM_THREADS syntax). If torch is already imported (a
    library caller, the tests) its thread count is the caller's: only FASTDLLM_THREADS changes it.
    `watch` (the CLI): where the count is ours (no FASTDLLM_THREADS / OMP_NUM_THREADS, torch not
    yet loaded by a caller), start thread_watch, which lowers it while other processes keep cores
    busy."""
    n, source = decide(environ)
    if watch and source == "physical cores" and "torch" not in sys.modules:
        thread_watch.start(n, set(allowed_cpus()))
    if n and source != "OMP_NUM_THREADS":
        if "torch" in sys.modules:
            if source == "FASTDLLM_THREADS":
                sys.modules["torch"].set_num_threads(n)
        else:
            environ["OMP_NUM_THREADS"] = str(n)
    return n
