"""Replicas: two `fastdllm serve` processes behind nginx, with the recipe the serve guide ships
(examples/replicas/nginx.conf, only its ports changed). Requests spread over both; when one replica
stops (SIGTERM) in the middle of a load, every request is still answered: its running ones finish
inside --shutdown-timeout, and what reaches it after (connection refused, or 503 for its queue) is
sent to the other by nginx."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_process import ServerProcess  # noqa: E402
from fastdllm.checkpoints.builtin import NAME as BUILTIN  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "replicas" / "nginx.conf"
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).is_file()), None)
BODY = {"model": BUILTIN, "prompt": "def add(a, b):", "max_tokens": 8}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx-light)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


def answered(server: ServerProcess) -> int:
    """Completions this replica answered with 200, from its /metrics."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    found = re.search(r'^fastdllm_requests_total\{endpoint="/v1/completions",status="200"\} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else 0


class Nginx:
    """nginx in the foreground with the recipe's config, its ports replaced by the test's."""

    def __init__(self, tmp: Path, backends: list[int]):
        self.port = free_port()
        config = RECIPE.read_text().replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")
        config = config.replace("127.0.0.1:8001", f"127.0.0.1:{backends[0]}")
        config = config.replace("127.0.0.1:8002", f"127.0.0.1:{backends[1]}")
        assert config.count(f"127.0.0.1:{backends[1]}") == 1, "the recipe's backends moved"
        (tmp / "nginx.conf").write_text(config)
        self.proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", "stderr",
                                      "-g", "daemon off;"], stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"nginx did not start: {self.proc.stderr.read() if self.proc.poll() is not None else ''}")
            time.sleep(0.1)

    def complete(self) -> httpx.Response:
        return httpx.post(self.url + "/v1/completions", json=BODY, timeout=300)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def test_requests_spread_over_two_replicas_and_none_is_lost_when_one_stops(tmp_path):
    with ThreadPoolExecutor(2) as pool:                 # both load at once
        first, second = pool.map(lambda _: ServerProcess("--dtype", "fp32", "--shutdown-timeout", "60"), range(2))
    proxy = None
    try:
        proxy = Nginx(tmp_path, [port_of(first), port_of(second)])

        # spread: one at a time, least_conn falls back to round robin between idle replicas
        statuses = [proxy.complete().status_code for _ in range(6)]
        assert statuses == [200] * 6
        spread = (answered(first), answered(second))
        assert sum(spread) == 6 and min(spread) >= 2, spread

        # a load of 8, and the first replica stops while it holds some of them
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(proxy.complete) for _ in range(8)]
            deadline = time.monotonic() + 120
            while answered(first) == spread[0] and httpx.get(first.url + "/health").json()["queue_depth"] == 0:
                assert time.monotonic() < deadline, "no request reached the first replica"
                time.sleep(0.02)
            stopper = threading.Thread(target=first.stop, kwargs={"timeout": 120})
            stopper.start()
            responses = [f.result() for f in futures]
        stopper.join(120)
        assert first.proc.returncode == 0, first.log
        assert [r.status_code for r in responses] == [200] * 8, [r.text[:200] for r in responses if r.status_code != 200]
        assert all(r.json()["choices"][0]["finish_reason"] in ("stop", "length") for r in responses)

        # after: everything goes to the second replica
        before = answered(second)
        assert [proxy.complete().status_code for _ in range(3)] == [200] * 3
        assert answered(second) == before + 3
    finally:
        if proxy is not None:
            proxy.stop()
        first.stop()
        second.stop()
