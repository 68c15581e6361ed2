#!/usr/bin/env python3
"""How long a command takes to show something, to finish its output, and to exit, on a terminal.

Runs the command in a pseudo-terminal (as a person's shell would: the live view and spinners on),
several times, and prints the median of three times from the start: the first byte the command
writes, its last byte, and its exit.

    python scripts/startup_time.py -- fastdllm --help
    python scripts/startup_time.py --runs 5 -- fastdllm generate "def add(a, b):" -n 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastdllm.testing.pty_run import run_on_pty  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command and its arguments")
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        parser.error("name a command after --")
    env = {**os.environ, "LINES": "40", "COLUMNS": "120", "TERM": os.environ.get("TERM", "xterm-256color")}
    runs = [run_on_pty(argv, env=env, timeout=600) for _ in range(args.runs)]
    if any(r.code for r in runs):
        raise SystemExit(f"the command failed (exit {[r.code for r in runs]}): {runs[-1].output[-500:]}")
    first, last, end = (statistics.median(getattr(r, k) for r in runs) for k in ("first", "last", "end"))
    print(f"{' '.join(argv)}: first output {first:.2f} s, last output {last:.2f} s, exit {end:.2f} s "
          f"(median of {args.runs}; exit - last output {end - last:.2f} s)")


if __name__ == "__main__":
    main()
