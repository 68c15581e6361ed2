"""`serve --tp N` (docs/specs/tensor-parallel.md): rank 0 answers HTTP and runs the scheduler; the
other ranks hold their share of every layer and decode the same batches in step with it, since
every forward is a collective of all ranks.

Rank 0's scheduler tells them, in its worker thread (the one thread that runs collectives there):

- a plan before each batch: decode.engine.stepper's arguments (Row.batch_args) with what does not
  travel replaced by what rebuilds it: each row's random stream by (job id, seed), kept by job
  across batches as rank 0 keeps it on the Row; a constraint by its Spec, compiled here;
- after each of the batch's events, whether the batch goes on (False) or is left there (True: rows
  leave or join at a block boundary, or the server is aborting);
- None when it shuts down: the followers return.

An idle server's followers wait in the broadcast (the process group's timeout is a week,
eval/distributed.WAIT). A follower ignores SIGINT and SIGTERM: it ends when rank 0 says so, or when
rank 0 is gone (the broadcast fails).
"""

from __future__ import annotations

import signal


class Leader:
    """Rank 0's side: what the scheduler tells the followers."""

    def __init__(self, world):
        self.world = world

    def plan(self, args: dict, job_ids: list[str], seeds: list[int]) -> None:
        """Before a batch built from `args` (Row.batch_args) of the jobs `job_ids`."""
        sent = {k: v for k, v in args.items() if k not in ("generators", "constraints")}
        sent["generators"] = list(zip(job_ids, seeds)) if args.get("generators") is not None else None
        constraints = args.get("constraints")
        sent["constraints"] = [c.spec if c is not None else None for c in constraints] if constraints else None
        self.world.broadcast(sent)

    def stepped(self, leave: bool) -> None:
        """After each event of the batch: whether rank 0 leaves the batch there."""
        self.world.broadcast(leave)

    def stop(self) -> None:
        self.world.broadcast(None)


def follow(world, decoder, tokenizer) -> None:
    """A rank after the first: decode rank 0's batches until it stops (or is gone)."""
    from ..decode.constraint import Compiled
    from ..decode.engine import stepper
    from ..decode.renoise import row_generator

    for sig in (signal.SIGINT, signal.SIGTERM):         # rank 0 decides when the server ends
        signal.signal(sig, signal.SIG_IGN)
    streams = {}                                        # job id -> its random stream, as rank 0's Row keeps it
    while (plan := world.broadcast()) is not None:
        if plan["generators"] is not None:
            streams = {job: streams.get(job) or row_generator(decoder.device, seed) for job, seed in plan["generators"]}
            plan["generators"] = [streams[job] for job, _ in plan["generators"]]
        if plan["constraints"] is not None:
            plan["constraints"] = [Compiled(spec, tokenizer) if spec is not None else None for spec in plan["constraints"]]
        batch = stepper(decoder, **{k: v for k, v in plan.items() if v is not None})
        for _ in batch.events():
            if world.broadcast():
                break
