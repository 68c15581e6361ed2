"""Where the trainer's batches come from: the source itself in the training process (workers 0:
seeded, its random state saved with the training state, so that a resumed run continues the same
stream), or `workers` processes drawing from copies of it (a GPU consumes rows faster than one
Python process generates and tokenizes them). Each worker's copy is reseeded from the run's seed, the
step the run starts at and the worker's number: the rows of a run with workers are reproducible from
its command and first step, not continued exactly across a resume."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class _Draws(IterableDataset):
    """Endless batches of `size` rows from a copy of `source` (one per worker process)."""

    def __init__(self, source, size: int, seed: int):
        self.source, self.size, self.seed = source, size, seed

    def __iter__(self):
        info = get_worker_info()
        self.source.reseed(self.seed * 1000 + (info.id if info else 0))
        while True:
            yield self.source.batch(self.size)


def stream(source, size: int, workers: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens (B, L), prompt_len (B,)) batches, for ever."""
    if workers <= 0:
        while True:
            yield source.batch(size)
    loader = DataLoader(_Draws(source, size, seed), batch_size=None, num_workers=workers,
                        prefetch_factor=4, persistent_workers=True, pin_memory=torch.cuda.is_available())
    yield from loader
