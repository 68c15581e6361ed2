"""Steerling's shared test pieces, used by tests/models/test_steerling.py (against the transcription in
tests/references/reference_steerling.py) and test_steerling_package.py (against the authors' package): the
prompts by length off and on the block grid (PROMPTS), the sampling settings (GREEDY, ENTROPY, TOP_P), an
embedding row that steers the tied head toward a token (steered_row, to place a stop where a test wants
it), and fastdllm's float64 decode of a checkpoint folder with its block size, the fixed rule and the
prefix cache unless told otherwise (ours: the Result and every event)."""

from __future__ import annotations

import json

import torch

from fastdllm.checkpoints.loading import load
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate

import reference_steerling as ref

PROMPTS = {3: [275, 32, 99], 8: [275, 32, 99, 264, 279, 32, 261, 276], 9: [256, 101, 264, 45, 17, 200, 275, 32, 99],
           15: [40, 275, 32, 99, 264, 279, 32, 261, 276, 32, 109, 264, 277, 276, 32]}
GREEDY = dict(entropy_sampling=False, temperature=0.0)
ENTROPY = dict(entropy_sampling=True, temperature=1.2, top_p=0.8)
TOP_P = dict(entropy_sampling=False, temperature=0.9, top_p=0.7)


def steered_row(folder, token: int, scale: float) -> torch.Tensor:
    """An embedding row along the masks' mean final hidden state: the tied head then favours `token`."""
    c = json.loads((folder / "config.json").read_text())
    h = ref.hidden(ref.load_tensors(folder), c, PROMPTS[9] + [c["mask_token_id"]] * 16)[9:]
    direction = h.mean(0)
    return scale * direction / direction.norm()


def ours(folder, prompts, **decode):
    """fastdllm's float64 decode of `prompts` on the folder's checkpoint: the Result and every event."""
    lm = load(folder, dtype="fp64")
    cfg = DecodeConfig(**{"block_len": json.loads((folder / "config.json").read_text())["diff_block_size"],
                          "rule": "fixed", "cache": "prefix", **decode})
    events = list(generate(lm.decoder, prompts, cfg))
    return events[-1], events
