"""Run a command on a pseudo-terminal, as a person's shell would (the live view and spinners on),
and keep its output with the times of its first and last byte and of its exit: what the start-up
tests read (tests/cli/test_startup.py) and what scripts/startup_time.py prints."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from dataclasses import dataclass


@dataclass
class PtyRun:
    code: int              # exit status (killed at the timeout: negative)
    output: str            # stdout and stderr as the terminal received them
    first: float           # seconds from the start to the first byte, the last byte, the exit
    last: float
    end: float


def run_on_pty(argv: list[str], cwd=None, env: dict | None = None, timeout: float = 300) -> PtyRun:
    """Run argv with stdin, stdout and stderr on one pty; read until it closes or the timeout."""
    master, slave = pty.openpty()
    start = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, first, last = b"", None, None
    while time.perf_counter() - start < timeout:
        if select.select([master], [], [], 0.05)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:                     # the child closed the pty
                break
            if not chunk:
                break
            last = time.perf_counter() - start
            first = last if first is None else first
            out += chunk
        elif p.poll() is not None:
            break
    p.kill() if p.poll() is None else None
    os.close(master)
    code = p.wait()
    end = time.perf_counter() - start
    return PtyRun(code, out.decode(errors="replace"), first or end, last or end, end)
