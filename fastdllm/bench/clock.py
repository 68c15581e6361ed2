"""One engine run of a bench batch, and the same run timed: the device synchronised before and
after (nothing queued before the clock starts) and, on CPU, the process's peak RSS restarted so
that each run reports its own."""

from __future__ import annotations

from ..decode.config import DecodeConfig
from ..decode.engine import Result, run
from ..decode.infill import Filling


def run_batch(lm, batch: list[Filling], cfg: DecodeConfig, constraint=None) -> Result:
    """One engine run of a batch; an infilling batch is one template, decoded at its holes;
    `constraint` (decode.constraint.Compiled) applies to every row."""
    return run(lm.decoder, [f.ids for f in batch], cfg, holes=batch[0].holes or None,
               constraints=[constraint] * len(batch) if constraint is not None else None)


def timed_run(lm, batch: list[Filling], cfg: DecodeConfig, constraint=None) -> Result:
    _sync(lm.device)                 # nothing queued before the clock starts
    _reset_peak_rss(lm.device)
    result = run_batch(lm, batch, cfg, constraint)
    _sync(lm.device)
    return result


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak_rss(device) -> None:
    """On CPU the engine reports the process's peak RSS; Linux lets us restart that peak so each
    record gets its own (elsewhere it stays the peak so far)."""
    if device.type != "cpu":
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
