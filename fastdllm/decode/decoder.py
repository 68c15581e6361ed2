"""What the engine decodes with: a model, its special tokens, a detokenizer and the context length.
checkpoints/ builds one from a loaded checkpoint (`LoadedModel.decoder`); tests build them directly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class SpecialTokens:
    mask: int
    pad: int
    stops: tuple[int, ...]        # an answer ends at the first of these (EOS, end-of-turn)
    eot: int | None = None        # the chat template's end-of-turn token, if any


@dataclass(frozen=True)
class Decoder:
    """What the engine decodes with: the model, its special tokens, a detokenizer and the context
    length (a LoadedModel gives one: `lm.decoder`). Nothing about files, placement or load time."""
    model: torch.nn.Module
    specials: SpecialTokens
    detokenize: Callable[[list[int]], str]
    context_length: int
    name: str = "this model"        # for messages
    encode: Callable[[str], list[int]] | None = None   # text -> ids, no special tokens (Prophet's anchors)

    @property
    def device(self) -> torch.device:
        return self.model.input_device
