"""How `fastdllm serve` stops (fastdllm/serve/shutdown.py): SIGTERM says on stderr what it waits
for, waits at most --shutdown-timeout seconds, then answers the running request with the blocks it
has finished (finish_reason "abort") and the queued one with 503, and exits 0. That the running
request may finish inside the wait: test_serve.py."""

from __future__ import annotations


import json
import signal
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_process import ServerProcess  # noqa: E402
from fastdllm.checkpoints.builtin import NAME as BUILTIN  # noqa: E402

LONG = {"model": BUILTIN, "messages": [{"role": "user", "content": "A long story."}], "max_tokens": 1024,
        "fastdllm": {"early_stop": False}}


@pytest.mark.slow
def test_idle_sigterm_says_so_and_exits_0():
    server = ServerProcess("--dtype", "fp32")
    assert server.stop() == 0, server.log
    assert server.log.splitlines()[-2:] == ["fastdllm serve: stopping", "fastdllm serve: stopped"]


def test_sigterm_waits_the_timeout_then_answers_what_is_left():
    server = ServerProcess("--dtype", "fp32", "--max-batch", "1", "--shutdown-timeout", "1")
    queued = {}

    def second():                               # same settings, but --max-batch 1: it waits in the queue
        queued["r"] = httpx.post(server.v1 + "/chat/completions", json=LONG, timeout=120)

    try:
        events, waiter = [], threading.Thread(target=second)
        with httpx.stream("POST", server.v1 + "/chat/completions", json={**LONG, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and not events:
                    waiter.start()
                    while httpx.get(server.url + "/health").json()["queue_depth"] < 1:
                        time.sleep(0.05)
                    server.proc.send_signal(signal.SIGTERM)
                    signalled = time.monotonic()
                if line.startswith("data: "):
                    events.append(line[6:])
        waited = time.monotonic() - signalled
        waiter.join(60)
        assert server.proc.wait(60) == 0, server.log
    finally:
        server.stop()
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    assert 1 <= waited < 30, waited                 # the whole answer takes ~40 s here
    assert queued["r"].status_code == 503 and "shutting down" in queued["r"].json()["error"]["message"]
    log = server.log
    assert ("stopping: waiting up to 1 s (--shutdown-timeout) for 1 running and 1 queued requests; "
            "then each is answered with what it has") in log
    assert "stopping: 1 s passed: 1 running answered with the blocks decoded so far (finish_reason abort), " \
           "1 queued with 503" in log
    assert " · 200 abort" in log and log.rstrip().endswith("fastdllm serve: stopped")
