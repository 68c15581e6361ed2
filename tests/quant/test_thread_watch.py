"""fastdllm/thread_watch.py: the thread count follows the cores other processes leave free. The
decisions on scripted /proc/stat readings; the CLI starts it only where the count is ours; every
forward of a CPU-loaded model passes through it."""

from __future__ import annotations

import pytest
import torch

from fastdllm import thread_watch, threads
from fastdllm.checkpoints import loading
from fastdllm.thread_watch import ThreadWatch, busy_seconds, threads_for

TICK = 100                                     # /proc/stat's clock ticks per second (USER_HZ)


def stat(busy: dict[int, float], idle: float = 0.0) -> str:
    """/proc/stat text with each cpuN's busy seconds split over user and system, `idle` seconds
    idle and iowait each, and lines that are not per-CPU around them."""
    lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]
    for cpu, seconds in busy.items():
        ticks = round(seconds * TICK)
        lines.append(f"cpu{cpu} {ticks // 2} 0 {ticks - ticks // 2} {round(idle * TICK)} {round(idle * TICK)} 0 0 0 0 0")
    return "\n".join(lines + ["intr 12345 1 2", "ctxt 999", "btime 1700000000"]) + "\n"


def test_busy_seconds_reads_the_cpus_asked_for(monkeypatch):
    monkeypatch.setattr(thread_watch.os, "sysconf", lambda name: TICK)
    text = stat({0: 1.5, 1: 2.25, 7: 40.0}, idle=3.0)
    assert busy_seconds({0, 1}, text) == pytest.approx(3.75)          # idle, iowait and cpu7 left out
    assert busy_seconds({7}, text) == pytest.approx(40.0)
    assert busy_seconds(set(), text) == 0


@pytest.mark.parametrize("others, cores, most, expected", [
    (0.0, 2, 2, 2), (0.3, 2, 2, 2), (0.4, 2, 2, 1), (0.5, 2, 2, 1), (1.0, 2, 2, 1), (1.9, 2, 2, 1),
    (0.0, 16, 16, 16), (1.0, 16, 16, 15), (3.5, 16, 16, 12), (0.0, 16, 8, 8), (20.0, 16, 16, 1)])
def test_threads_for_gives_the_busy_cores_up(others, cores, most, expected):
    assert threads_for(others, cores, most) == expected


class Machine:
    """Scripted time, /proc/stat and this process's CPU time: `run(seconds, ours, others)` advances
    the clock with this process using `ours` cores and other processes `others`."""

    def __init__(self):
        self.now, self.busy, self.own, self.set = 0.0, 0.0, 0.0, []

    def run(self, seconds: float, ours: float, others: float) -> None:
        self.now += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds

    def watch(self, most: int = 2) -> ThreadWatch:
        return ThreadWatch(most, most, {0, 1}, every=0.5, read_stat=lambda: stat({0: self.busy}),
                           own_seconds=lambda: self.own, clock=lambda: self.now, set_threads=self.set.append)


def test_the_watch_gives_a_busy_core_up_and_takes_it_back(monkeypatch):
    monkeypatch.setattr(thread_watch.os, "sysconf", lambda name: TICK)
    m = Machine()
    w = m.watch()
    m.run(0.3, ours=2, others=0)
    assert w.poll() == 2 and m.set == []                               # not yet time to look
    m.run(0.7, ours=1.4, others=0.6)                   # a busy process shares a core: 0.42 over the 1 s
    assert w.poll() == 1 and m.set == [1]
    m.run(1.0, ours=1, others=1)                                       # it now has its core
    assert w.poll() == 1 and m.set == [1]
    m.run(1.0, ours=1, others=0.1)                                     # it ended: a short command
    assert w.poll() == 2 and m.set == [1, 2]
    m.run(1.0, ours=2, others=0)
    assert w.poll() == 2 and m.set == [1, 2]


def test_a_caller_that_loaded_torch_keeps_its_thread_count(monkeypatch):
    """In a library caller or a test (torch already loaded) the count is the caller's: no watch.
    That the CLI starts one, and not under FASTDLLM_THREADS: tests/quant/test_threads.py (a new process)."""
    monkeypatch.setattr(thread_watch, "WATCH", None)
    threads.configure({}, watch=True)
    assert thread_watch.WATCH is None


def test_every_forward_of_a_cpu_model_passes_through_the_watch(llada_dir, monkeypatch):
    monkeypatch.setattr(thread_watch.os, "sysconf", lambda name: TICK)
    lm = loading.load(llada_dir, dtype="fp32")
    m = Machine()
    monkeypatch.setattr(thread_watch, "WATCH", m.watch())
    m.run(1.0, ours=1, others=1)
    with torch.no_grad():
        lm.model(torch.tensor([[1, 2, 3]]))
    assert m.set == [1]                                                # the forward's embedding looked
