"""Keep freed host memory for reuse instead of handing it back to the kernel after every forward.

glibc's malloc serves a block over its mmap threshold (128 KB, rising with the blocks freed up to
32 MB) with a fresh mmap and unmaps it on free, and trims free memory at the heap's top above twice
that threshold. A CPU forward allocates and frees the same activations every step (attention
scores, logits, MLP activations: several blocks of 10-30 MB at a 1024-token canvas), so each step
page-faulted them in again, zero-filled by the kernel (tens of thousands of faults per uncached
forward of the built-in model at gen_len 1024). With the mmap threshold at its largest (32 MB) and
trimming only above 256 MB at the heap's top, the freed blocks stay in the heap and the next step
reuses them (figures: docs/guide/cpu.md). Blocks over
32 MB still get their own mapping when no free heap space fits them, and go back to the kernel when
freed: a model's load-time buffers (dtype conversions, weight packing, GB at a time) do not stay in
the process. (Turning mmap off altogether kept them: a 1.5B benchmark grew past 24 GB.)

Applied once per process by the CLI. Left alone where the user chose the allocator's behaviour
(glibc's MALLOC_* variables or GLIBC_TUNABLES for malloc, or a preloaded allocator), and off glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3    # glibc's <malloc.h> parameter numbers
MMAP_ABOVE = 32 << 20                           # glibc's largest mmap threshold on 64-bit systems
TRIM_ABOVE = 256 << 20                          # bytes free at the heap's top before it is trimmed
state: str | None = None                        # what keep_freed() did in this process (`info` shows it)
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def decide(environ=os.environ, libc: str | None = None) -> str | None:
    """Why the allocator is left alone, or None when keep_freed() may tune it."""
    libc = platform.libc_ver()[0] if libc is None else libc
    if libc != "glibc":
        return f"not glibc ({libc or 'unknown C library'})"
    if chosen := [name for name in USER_SETTINGS if name in environ]:
        return f"{chosen[0]} is set"
    if "malloc" in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc"
    if "malloc" in environ.get("LD_PRELOAD", ""):
        return "an allocator is preloaded (LD_PRELOAD)"
    return None


def keep_freed(environ=os.environ) -> str:
    """mmap only above MMAP_ABOVE, trim only above TRIM_ABOVE; says what it did, or why not."""
    global state
    if reason := decide(environ):
        state = f"left as it is: {reason}"
    else:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        done = mallopt(M_MMAP_THRESHOLD, MMAP_ABOVE) and mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE)
        state = "freed blocks kept for reuse" if done else "left as it is: mallopt refused"
    return state
