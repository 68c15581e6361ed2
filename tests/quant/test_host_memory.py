"""fastdllm/host_memory.py: the CLI keeps freed large blocks for reuse instead of page-faulting
them in again every forward, measured by the kernel's own count of minor page faults."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from fastdllm import host_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# As a forward's activations: allocate four 24 MB blocks, touch every page, free them; six times.
# Print the minor page faults of the last five (the first grows the heap).
CYCLES = """
import resource, sys
from fastdllm import host_memory
print(host_memory.keep_freed())
def cycle():
    blocks = [bytearray(24 << 20) for _ in range(4)]
    for block in blocks:
        block[::4096] = b"x" * len(range(0, 24 << 20, 4096))
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def python(code: str, env_extra: dict) -> list[str]:
    """The output lines of `code` in a new interpreter, without the user's malloc settings."""
    env = {k: v for k, v in os.environ.items() if k not in host_memory.USER_SETTINGS and k != "GLIBC_TUNABLES"}
    return subprocess.run([sys.executable, "-c", code], env={**env, **env_extra}, capture_output=True, text=True,
                          check=True).stdout.split("\n")


def faults(env_extra: dict) -> tuple[str, int]:
    out = python(CYCLES, env_extra)
    return out[0], int(out[1])


@pytest.mark.skipif(not GLIBC, reason="mallopt's parameters are glibc's")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    state, kept = faults({})
    assert state == "freed blocks kept for reuse"
    left_state, left = faults({"MALLOC_MMAP_MAX_": "65536"})     # glibc's default, set by the user: left alone
    assert left_state == "left as it is: MALLOC_MMAP_MAX_ is set"
    pages = 5 * 4 * (24 << 20) // 4096
    assert left >= pages * 0.9            # every cycle maps the blocks afresh: each page faulted in again
    assert kept < pages * 0.01            # the heap keeps the blocks: their pages stay mapped


@pytest.mark.skipif(not GLIBC, reason="mallopt's parameters are glibc's")
def test_blocks_over_32_mb_still_go_back_to_the_kernel():
    code = """
from fastdllm import host_memory
host_memory.keep_freed()
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
block = bytearray(512 << 20)                 # a load-time buffer: mapped apart, returned when freed
block[::4096] = b"x" * len(range(0, 512 << 20, 4096))
with_block = rss_mb()
del block
print(with_block - rss_mb())
"""
    freed = int(python(code, {})[0])
    assert freed >= 500                      # MB the process gave back


def test_the_users_allocator_choices_are_left_alone():
    assert host_memory.decide({}, libc="glibc") is None
    assert host_memory.decide({"MALLOC_TRIM_THRESHOLD_": "0"}, libc="glibc") == "MALLOC_TRIM_THRESHOLD_ is set"
    assert host_memory.decide({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, libc="glibc") == \
        "GLIBC_TUNABLES sets malloc"
    assert host_memory.decide({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, libc="glibc") is None
    assert host_memory.decide({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}, libc="glibc") == \
        "an allocator is preloaded (LD_PRELOAD)"
    assert host_memory.decide({}, libc="") == "not glibc (unknown C library)"
    assert host_memory.decide({}, libc="musl") == "not glibc (musl)"


def test_info_says_what_the_cli_did_with_malloc(monkeypatch):
    from typer.testing import CliRunner

    from fastdllm.cli.app import app

    monkeypatch.setenv("MALLOC_TOP_PAD_", "131072")     # left alone: this process's malloc is not changed
    result = CliRunner().invoke(app, ["info", "--json"])
    assert result.exit_code == 0, result.output
    assert '"malloc": "left as it is: MALLOC_TOP_PAD_ is set"' in result.output
