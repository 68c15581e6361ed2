"""Data parallelism under the field's launchers (torchrun, accelerate launch): one process per
device, each with its share of the work, rank 0 gathering; `launch` is `--num-processes N`.

A process learns its place from the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), as both launchers set it. The process group runs on gloo
whatever the device: what crosses between processes is a few kilobytes of Python objects per task
(answers' metrics, counters, errors), which gloo moves on any machine, while the model's tensors
never leave their device (nccl's object collectives would add device bookkeeping for nothing).
Tensor parallel (`generate --tp N`) is the exception: its activations cross between ranks, so on
GPUs it joins with NCCL beside gloo (`from_env("cpu:gloo,cuda:nccl")`).

Failures: work that raises on one rank is reported at the next exchange (`exchange`), where every
rank stops and rank 0 says which rank failed, in one line. A rank that dies outright is the
launcher's to report; the others' next collective fails (`PeersLost`) or the launcher stops them.

Test hook: FASTDLLM_FAIL_RANK=R:NAME makes rank R raise when it starts the work named NAME (an
eval task, a bench row), to exercise the failure path (tests/eval/test_eval_parallel.py).
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from ..errors import UserError

FAIL_ENV = "FASTDLLM_FAIL_RANK"
# ranks wait at a gather for the slowest one's share: hours on a long task, never a reason to fail
WAIT = timedelta(days=7)


class RankFailed(UserError):
    """Work raised on one rank; every rank stops at the exchange, rank 0 names it. Only rank 0's
    exit code says so (`here`: the rank raising this): a follower leaving with 1 before rank 0
    has could make the launcher stop rank 0 and report the follower in a second line."""

    def __init__(self, rank: int, message: str, here: int = 0):
        super().__init__(f"rank {rank}: {message}")
        self.exit_code = 1 if here == 0 else 0


class PeersLost(UserError):
    def __init__(self, rank: int, error: Exception):
        super().__init__(f"rank {rank} lost the other processes of this run (one of them ended; the launcher "
                         f"names it): {str(error).splitlines()[0] if str(error) else type(error).__name__}")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def first(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: Any) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.size
        try:
            dist.all_gather_object(out, obj)
        except RuntimeError as e:              # gloo: a peer's connection closed
            raise PeersLost(self.rank, e) from None
        return out

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (what the others pass is ignored)."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        try:
            dist.broadcast_object_list(box, src=0)
        except RuntimeError as e:              # gloo: a peer's connection closed
            raise PeersLost(self.rank, e) from None
        return box[0]

    def exchange(self, work: Callable[[], Any]) -> list:
        """Run `work` here and gather every rank's result; if it raised on any rank, every rank
        raises RankFailed naming the first (a lone process just raises)."""
        if self.size == 1:
            return [work()]
        try:
            result, failure = work(), None
        except Exception as e:
            result, failure = None, describe(e)
        return self.report(failure, result)

    def report(self, failure: str | None, result: Any) -> list:
        """Gather every rank's (failure, result); raise RankFailed on the first failure, else
        return the results in rank order."""
        gathered = self.all_gather((failure, result))
        for rank, (failed, _) in enumerate(gathered):
            if failed is not None:
                raise RankFailed(rank, failed, here=self.rank)
        return [r for _, r in gathered]

    def device(self, requested: str) -> str:
        """This rank's device: its own GPU (cuda:LOCAL_RANK) where the run asks for CUDA or
        'auto' finds it, else the CPU."""
        if self.size == 1:
            return requested
        import torch

        if requested.startswith("cuda:"):
            raise UserError(f"--device {requested} would put every process on one GPU: give --device cuda (each "
                            f"process takes cuda:LOCAL_RANK) or cpu")
        if requested in ("auto", "cuda") and torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            return f"cuda:{self.local_rank}"
        return "cpu" if requested == "auto" else requested

    def share_threads(self) -> None:
        """CPU processes on one machine share its cores: cores / processes each (the launchers set
        one thread, which leaves most cores idle)."""
        if self.size == 1:
            return
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // self.local_size))


def describe(e: Exception) -> str:
    return str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"


def from_env(backend: str = "gloo") -> World:
    """This process's World from the launcher's environment, joining the process group once (tensor
    parallel on GPUs joins with "cpu:gloo,cuda:nccl": its tensors cross between devices)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    import torch.distributed as dist

    world = World(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0")),
                  int(os.environ.get("LOCAL_WORLD_SIZE", size)))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=WAIT)
        atexit.register(_leave)
    return world


def _leave() -> None:
    """At exit (lm-eval's own command line under a launcher), every rank together: gloo's threads
    still running when the interpreter ends, or a peer closing its connections while they run,
    abort the process ("terminate called without an active exception"), which the launcher reports
    as a failure. A peer already gone is no error."""
    import torch.distributed as dist

    try:
        dist.barrier()
    except RuntimeError:
        pass
    dist.destroy_process_group()


def finish(code: int | str | None) -> None:
    """The `fastdllm` command's end on a rank of a parallel run: every rank together, then out with
    os._exit, streams flushed. The interpreter's own teardown (gloo's threads and the group's C++
    objects destroyed while a peer closes its connections) could still abort a rank after `_leave`
    ("terminate called without an active exception", seen once under a loaded suite), which the
    launcher reports as a second failure. Nothing to do outside a process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if isinstance(code, str):                       # SystemExit("message"): Python prints it, exits 1
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        dist.barrier()
    except RuntimeError:
        pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def injected(world: World, name: str | None) -> None:
    """The test hook (FASTDLLM_FAIL_RANK=R:NAME): raise on rank R when it starts NAME."""
    if os.environ.get(FAIL_ENV) == f"{world.rank}:{name}":
        raise RuntimeError(f"failure injected by {FAIL_ENV}")


def same_package_main() -> str:
    """`python -c` code that runs the `fastdllm` command from this very package: the folder holding
    it goes first on sys.path (not the working directory, where `-m fastdllm` would import a source
    checkout's `fastdllm/` while the parent runs an installed copy, or the reverse)."""
    import fastdllm

    home = str(Path(fastdllm.__file__).resolve().parent.parent)
    return (f"import sys; sys.path[0] = {home!r}; sys.argv[0] = 'fastdllm'; "
            "from fastdllm.cli.app import main; main()")


def launch(processes: int, argv: list[str], signal_stops: bool = False) -> int:
    """`--num-processes N`: run the `fastdllm` command (same_package_main) with ARGV N times under torchrun's own machinery
    (torch.distributed's elastic launch, as `torchrun --standalone --nproc-per-node N`); returns
    the exit code. Rank 0 reports a failure it saw in one line; where it could not (it was
    stopped, or a rank died outright), the first rank to fail is named here. SIGINT or SIGTERM
    here is passed on to the ranks by the launcher, which waits for them: 0 where the command ends
    that way by design (`signal_stops`: serve), else 128 + the signal, as a shell reports it."""
    import logging
    import sys
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:   # its reports: ours below
        if name.startswith("torch.distributed.elastic"):     # (its modules' loggers set their own level)
            logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    try:
        elastic_launch(config, sys.executable)("-c", same_package_main(), *argv)
    except ChildFailedError as e:
        first = e.failures.get(0)
        if first is not None and first.exitcode > 0:
            return first.exitcode                                 # rank 0 said what happened
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        print(f"error: rank {rank} ended ({how}); the run stopped, its finished results kept in --output if given",
              file=sys.stderr)
        return 1
    except SignalException as e:                                  # the ranks were stopped and waited for
        return 0 if signal_stops else 128 + int(e.sigval)
    return 0


# ---------------------------------------------------------------- lm-eval's protocol (harness.py)
def copies(requests) -> list[int | None]:
    """Each request's copy number k among lm-eval's clones of its Instance (one object, `repeats`
    times); None for a copy beyond `repeats`: the padding lm-eval adds in parallel runs so that
    every rank has as many requests."""
    seen: dict[int, int] = {}
    out = []
    for r in requests:
        k = seen[id(r)] = seen.get(id(r), -1) + 1
        out.append(k if k < (getattr(r, "repeats", None) or 1) else None)
    return out


def padded(requests, out: list) -> list:
    """Padding copies answered as their Instance's first copy (lm-eval appends them to its
    responses, where the filters take the first)."""
    first: dict[int, object] = {}
    for r, answer in zip(requests, out):
        first.setdefault(id(r), answer)
    return [first[id(r)] if answer is None else answer for r, answer in zip(requests, out)]


def in_document_order(parts: list) -> list:
    """lm-eval's per-rank metric lists ({task: {(metric, filter): [value per document]}}) merged
    into one (a list of one part), in the document order of a single process: rank r holds
    documents r, r + N, ... (its doc_iterator), so the merge takes one value from each rank in
    turn. Anything else is returned as the ranks' parts."""
    def lists(p):
        return isinstance(p, dict) and all(isinstance(v, dict) and all(isinstance(x, list) for x in v.values())
                                           for v in p.values())

    if len(parts) == 1 or not all(lists(p) for p in parts):
        return parts
    merged: dict = {}
    for task in parts[0]:
        merged[task] = {}
        for key in parts[0][task]:
            shares = [p[task].get(key, []) for p in parts]
            merged[task][key] = [x for turn in itertools.zip_longest(*shares, fillvalue=SKIP) for x in turn
                                 if x is not SKIP]
    return [merged]


SKIP = object()
