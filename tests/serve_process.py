"""A real `fastdllm serve` process for the tests (test_serve.py, test_serve_load.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

# the installed command (a `python -c` run from the checkout would import the source tree's
# `fastdllm`, which has no `cli` subpackage when the project is installed normally, as in CI)
COMMAND = str(Path(sys.executable).with_name("fastdllm"))


class ServerProcess:
    """`fastdllm serve --port 0 ARGS` in a child process; its stderr is collected line by line."""

    def __init__(self, *args: str, startup_s: float = 120.0):
        # FASTDLLM_CPU_DTYPE stays: the suite's fp32 pin of --dtype auto (conftest.py)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTDLLM_") or k == "FASTDLLM_CPU_DTYPE"}
        env["OMP_NUM_THREADS"] = "1"        # tiny models: threads only add overhead (and contend with the tests)
        self.proc = subprocess.Popen([COMMAND, "serve", "--port", "0", *map(str, args)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()
        self.url = self.wait_for_log(r"fastdllm serve: (http://\S+)/v1 \(model ", startup_s).group(1)
        self.v1 = self.url + "/v1"
        while httpx.get(self.url + "/health", timeout=10).status_code != 200:
            time.sleep(0.1)

    def _collect(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_log(self, pattern: str, timeout: float = 120.0) -> re.Match:   # generous: CI may be busy
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := re.search(pattern, self.log):
                return found
            if self.proc.poll() is not None:            # exited: the collector may still be a line behind
                deadline = min(deadline, time.monotonic() + 0.5)
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the server log (exit code {self.proc.poll()}):\n{self.log}")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
