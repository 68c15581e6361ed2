"""`--num-processes N` and the launchers, for eval and bench: a command started by torchrun or
accelerate launch joins its process group (fastdllm/eval/distributed.py), takes its own device
and share of the cores, and only rank 0 speaks; a command given --num-processes N outside a
launcher checks its flags, then starts N copies of itself under torchrun's machinery."""

from __future__ import annotations

import os
import sys

from fastdllm.errors import UsageError

from .terminal import err_console


def quiet_followers() -> None:
    """Under a launcher, ranks after the first print nothing from the start (their mistakes are
    rank 0's too, which says them once; their failures are reported by rank 0)."""
    if int(os.environ.get("RANK", "0")) > 0:
        err_console.quiet = True


def wanted(processes: int | None) -> bool:
    """Whether this command should start the processes itself (not yet under a launcher)."""
    if processes is not None and processes < 1:
        raise UsageError(f"--num-processes {processes}: give at least 1")
    return bool(processes and processes > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1)


def launch(processes: int, signal_stops: bool = False) -> int:
    """Run this command line again in `processes` processes; their exit code (`signal_stops`: a
    command that SIGINT/SIGTERM ends normally, serve)."""
    from fastdllm.eval.distributed import launch as start

    return start(processes, sys.argv[1:], signal_stops)


def join(processes: int | None, placement: dict):
    """This process's World; under a launcher its device goes into `placement`, and ranks after
    the first print nothing (rank 0 reports for all, their failures included)."""
    from fastdllm.eval import distributed

    world = distributed.from_env()
    if processes is not None and processes != world.size:
        raise UsageError(f"--num-processes {processes}, but the launcher started {world.size} processes")
    if world.size > 1 and (placement.get("device_map") or placement.get("max_memory")):
        raise UsageError("--device-map / --max-memory split one model over this machine's devices; each of "
                         "--num-processes' processes holds a whole model on its own device: give one or the other")
    if world.size > 1:
        err_console.quiet = not world.first
        placement["device"] = world.device(placement["device"])
        world.share_threads()
    return world


def tensor_parallel(tp: int, placement: dict):
    """`--tp N` under a launcher: this process's World (gloo on a CPU, NCCL for the tensors on GPUs),
    its device in `placement` (cuda:LOCAL_RANK or the CPU) and the Ranks its model loads with; ranks
    after the first print nothing. The launcher must have started N processes."""
    import torch

    from fastdllm.eval import distributed
    from fastdllm.models.tensor_parallel import Ranks

    quiet_followers()                             # a mistake below is rank 0's to say, once
    cuda = torch.cuda.is_available() and placement["device"] != "cpu"
    world = distributed.from_env("cpu:gloo,cuda:nccl" if cuda else "gloo")
    if world.size != tp:
        raise UsageError(f"--tp {tp}, but the launcher started {world.size} process{'es' * (world.size != 1)}")
    err_console.quiet = not world.first
    placement["device"] = world.device(placement["device"])
    world.share_threads()
    return world, Ranks(world.rank, world.size)


def split_run(tp: int | None, opts, command_refusal: str | None = None, *, signal_stops: bool = False):
    """split_over for a command run with RunOptions (generate, serve): this rank's device goes into opts."""
    placement = {"device": opts.device, "quantize": opts.quantize, "device_map": opts.device_map,
                 "max_memory": opts.max_memory}
    world, ranks = split_over(tp, placement, command_refusal, signal_stops=signal_stops)
    opts.device = placement["device"]
    return world, ranks


def split_over(tp: int | None, placement: dict, command_refusal: str | None = None, *, signal_stops: bool = False):
    """--tp N for any command: (World, Ranks) of this process under a launcher (its device put into
    `placement`), or N copies of this command line started here (the process exits with theirs);
    (None, None) without it or with --tp 1. The flags it does not combine with are refused first,
    `command_refusal` (what the command cannot split yet) among them."""
    if tp is None or tp == 1:
        return None, None
    import typer

    from fastdllm.checkpoints.tensor_parallel import refuse

    refuse(tp, quantize=placement.get("quantize", "none"), device_map=placement.get("device_map"),
           max_memory=placement.get("max_memory"))
    if command_refusal:
        raise UsageError(f"--tp {tp}: {command_refusal}")
    if wanted(tp):                                 # not under a launcher yet: start the ranks
        raise typer.Exit(launch(tp, signal_stops))
    return tensor_parallel(tp, placement)
