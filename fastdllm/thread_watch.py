"""The CPU thread count follows the cores other processes leave free (README, "On a CPU").

OpenMP's worker threads spin for a while after each parallel region before they sleep (libgomp's
default). On a quiet machine that is what makes a decode step fast: a step runs hundreds of short
regions, and waking a sleeping thread for each costs 2x at the 0.5B shape. Beside a busy process
the same spinning is what makes it slow: a thread that waits for a partner the scheduler has set
aside spins away the time that partner needs. So the threads spin, and the watch keeps them off
the busy cores: at most every `every` seconds, from the forward of a CPU model, it reads how much
of this process's CPUs other processes took since the last look (/proc/stat, less this process's
own time) and sets torch's thread count to the cores they leave free, at least 1. With one thread
nothing waits for a partner.

Started by the CLI when the user did not choose a thread count (FASTDLLM_THREADS, OMP_NUM_THREADS),
not for library callers."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Another process's share, in cores, from which one thread gives way: two threads beside a busy
# process see it at about half a core (they share its core with it), a short command at a tenth.
GIVE_WAY = 0.35


def busy_seconds(cpus: set[int], text: str) -> float:
    """CPU seconds the logical `cpus` spent busy since boot, from /proc/stat's text (cpuN lines:
    user nice system idle iowait irq softirq steal ..., in clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields[:8]]
            total += sum(ticks) - ticks[3] - ticks[4]                    # less idle and iowait
    return total / tick


def threads_for(others: float, cores: int, most: int) -> int:
    """Threads to run when other processes took `others` cores of our `cores` on average."""
    return max(1, min(most, cores - math.ceil(others - GIVE_WAY)))


class ThreadWatch:
    def __init__(self, most: int, cores: int, cpus: set[int], *, every: float = 0.5,
                 read_stat=lambda: PROC_STAT.read_text(), own_seconds=lambda: sum(os.times()[:2]),
                 clock=time.monotonic, set_threads=None):
        self.most, self.cores, self.cpus, self.every = most, cores, cpus, every
        self.read_stat, self.own_seconds, self.clock = read_stat, own_seconds, clock
        self.set_threads = set_threads or _torch_set_threads
        self.threads = most
        self.last = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        return self.clock(), busy_seconds(self.cpus, self.read_stat()), self.own_seconds()

    def poll(self) -> int:
        """Look again if `every` seconds have passed; returns the thread count now in force."""
        if self.clock() - self.last[0] < self.every:
            return self.threads
        now = self._sample()
        wall, busy, own = (a - b for a, b in zip(now, self.last))
        self.last = now
        others = max(0.0, busy - own) / wall if wall > 0 else 0.0
        wanted = threads_for(others, self.cores, self.most)
        if wanted != self.threads:
            self.set_threads(wanted)
            self.threads = wanted
        return self.threads


def _torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


WATCH: ThreadWatch | None = None


def start(threads: int, cpus: set[int]) -> None:
    """The CLI's: watch the logical `cpus` this process may run on from now on, with `threads` as
    the most (the physical cores among them)."""
    global WATCH
    try:
        WATCH = ThreadWatch(threads, threads, cpus)
    except (OSError, ValueError):        # no /proc/stat (not Linux): the fixed count stays
        WATCH = None


def poll(*_) -> None:
    """A forward pre-hook: cheap when it is not yet time to look."""
    if WATCH is not None:
        WATCH.poll()
