"""Tensor-parallel runs for the tests (tests/models/test_tensor_parallel.py): N ranks on gloo, started with
torch.multiprocessing's spawn, each loading its share of a checkpoint and decoding every case; rank 0
writes each case's committed canvas and NFE (and whether every rank decoded the same) as JSON.
The ranks are forked by default (they inherit the imported torch: a spawned one imports it again,
15-25 s on a busy 2-core machine); `method="spawn"` where forking is unsafe (a CUDA parent)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(checkpoint: Path, cases: list[dict], prompts: list[list[int]], out: Path, *, ranks: int = 2,
              dtype: str = "fp64", method: str = "fork") -> dict:
    """Decode each case (DecodeConfig fields) on `ranks` spawned processes; rank 0's results by case index."""
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(ranks, free_port(), str(checkpoint), cases, prompts, str(out), dtype),
                       nprocs=ranks, start_method=method)
    return json.loads(Path(out).read_text())


def decode_cases(lm, cases: list[dict], prompts: list[list[int]]) -> list[dict]:
    """Each case's committed canvas (B, gen_len) and NFE, one process or one rank."""
    import torch

    from ..decode.config import DecodeConfig
    from ..decode.engine import run

    from ..models.tensor_parallel import split_head

    out, head = [], split_head(lm.model)
    for case in cases:
        before = head.decisions if head else 0
        with torch.inference_mode():
            result = run(lm.decoder, prompts, DecodeConfig(**case))
        out.append({"canvas": result.canvas.tolist(), "nfe": result.nfe,
                    "split_decisions": (head.decisions - before) if head else 0})
    return out


def _rank(rank: int, size: int, port: int, checkpoint: str, cases, prompts, out: str, dtype: str) -> None:
    import torch
    import torch.distributed as dist

    from ..checkpoints import tensor_parallel
    from ..models.tensor_parallel import Ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        lm = tensor_parallel.load(checkpoint, Ranks(rank, size), dtype=dtype, device="cpu")
        mine = decode_cases(lm, cases, prompts)
        every = [None] * size
        dist.all_gather_object(every, mine)
        if rank == 0:
            Path(out).write_text(json.dumps({"results": mine, "ranks_agree": all(r == mine for r in every)}))
    finally:
        dist.destroy_process_group()
