"""`fastdllm pull` as a process, against the stand-in hub (tests/hub_server.py): Ctrl+C in the
middle of a slow transfer stops it at once (not when the transfer ends), leaves no half-written
file and no copy that is listed or used, and the next pull fetches only the rest; a hub that goes
away mid-transfer gives one line per retry, fastdllm's, and the pull's one error line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hub_server import Hub
from pull_repo import REPO, tiny_files  # noqa: F401  (a fixture)

BLOBS = "models--JetLM--SDAR-1.7B-Chat/blobs"


@pytest.fixture
def hub(tiny_files, tmp_path):  # noqa: F811
    server = Hub(repos={REPO: dict(tiny_files)}).start()
    yield server
    server.stop()


def start(hub: Hub, tmp_path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.Popen([sys.executable, "-m", "fastdllm", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run(hub: Hub, tmp_path, *args: str) -> subprocess.CompletedProcess:
    process = start(hub, tmp_path, *args)
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_ctrl_c_stops_a_pull_at_once_and_leaves_no_copy_that_counts(hub, tmp_path):
    hub.slow.add("model.safetensors")                       # 14 s to send
    process = start(hub, tmp_path, "pull", REPO)
    deadline = time.monotonic() + 120
    while "model.safetensors" not in hub.fetched():          # its transfer has begun
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - sent < 5, err                 # was: when the transfer ended, 14 s later
    assert process.returncode == 130 and err.splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err and out == ""
    blobs = tmp_path / "cache" / BLOBS
    assert not [b.name for b in blobs.iterdir() if b.name.endswith("incomplete")]
    time.sleep(1)                                           # nothing goes on once the process has ended
    assert "sdar:1.7b-chat" not in run(hub, tmp_path, "list").stdout
    kept = set(hub.fetched()) - {"model.safetensors"}
    hub.slow.clear()
    hub.requests.clear()
    again = run(hub, tmp_path, "pull", REPO)
    assert again.returncode == 0, again.stderr
    assert "model.safetensors" in hub.fetched() and not kept & set(hub.fetched())  # only the rest
    assert "sdar:1.7b-chat" in run(hub, tmp_path, "list").stdout


def test_a_hub_gone_mid_transfer_gives_one_line_per_retry_and_one_error_line(hub, tmp_path):
    hub.dead.add("model.safetensors")                       # half the bytes, then no answer at all
    done = run(hub, tmp_path, "pull", REPO)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    retries = [line for line in lines if line.startswith("model.safetensors: the transfer broke off at ")]
    assert 1 <= len(retries) <= 5 and all(line.endswith(f"resuming (retry {i + 1})") for i, line in enumerate(retries))
    assert lines[-1].startswith("error: download of JetLM/SDAR-1.7B-Chat failed at model.safetensors (")
    assert lines[-1].endswith("run the same pull again to fetch the rest")
    assert [line for line in lines if line not in retries[:] + lines[-1:]] == [
        "fetching generation_config.json (39 B)", "fetching model.safetensors (71.4 KB)"]   # and nothing else
    assert not [b.name for b in (tmp_path / "cache" / BLOBS).iterdir() if b.name.endswith("incomplete")]
    assert "sdar:1.7b-chat" not in run(hub, tmp_path, "list").stdout
