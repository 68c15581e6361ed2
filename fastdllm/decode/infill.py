"""Infilling: text with holes, as one canvas row the engine decodes (canvas.plan_infill).

A template is text with placeholders: `<|mask:N|>` is a hole of N tokens, `<|mask|>` a hole of the
default length (the profile's gen_len). `--suffix` is the one-hole template prompt + hole + suffix.
The text between holes is tokenized piece by piece (holes are token boundaries) and never changes;
only the holes are decoded.

A hole's length is fixed; the model ends a fill that needs fewer tokens with end-of-text padding.
Trimming (the default) cuts each hole at its first end token; untrimmed, the padding stays in the
text as the model wrote it. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ..errors import UserError

# "<|mask" up to the next "|>": one of our placeholders, or a mistake in one (never silently text)
PLACEHOLDER = re.compile(r"<\|mask(.*?)\|>", re.S)
KNOWN = "<|mask|> or <|mask:N|> with N >= 1"


@dataclass(frozen=True)
class Filling:
    """One template, tokenized: the canvas row and where its holes are."""
    ids: list[int]                      # text tokens, the mask id at every hole position
    holes: list[tuple[int, int]]        # each hole's [start, end) in ids, in template order
    texts: list[str]                    # the text around the holes: len(holes) + 1 pieces

    @property
    def text_tokens(self) -> int:
        return len(self.ids) - sum(e - s for s, e in self.holes)


def parse(template: str) -> list[str | int | None]:
    """Text pieces and holes (an int N, or None for the default length), alternating, starting and
    ending with text (possibly empty). A placeholder that is not one of the two forms is an error
    with its line and column."""
    parts: list[str | int | None] = []
    at = 0
    for m in PLACEHOLDER.finditer(template):
        inner = m.group(1)
        n = None if inner == "" else int(inner[1:]) if re.fullmatch(r":[0-9]+", inner) else -1
        if n is not None and n < 1:
            line = template.count("\n", 0, m.start()) + 1
            column = m.start() - (template.rfind("\n", 0, m.start()) + 1) + 1
            shown = m.group(0) if len(m.group(0)) <= 40 else m.group(0)[:37] + "..."
            raise UserError(f"line {line}, column {column}: unknown placeholder {shown!r} (expected {KNOWN})")
        parts += [template[at:m.start()], n]
        at = m.end()
    parts.append(template[at:])
    if len(parts) == 1:
        raise UserError(f"the template has no holes: mark each one with {KNOWN}")
    return parts


def tokenize(parts: list[str | int | None], encode: Callable[[str], list[int]], *, mask: int,
             default_len: int, mask_text: str | None = None) -> Filling:
    """The canvas row of `parts` (parse's output); `encode` tokenizes text without special tokens."""
    ids: list[int] = []
    holes, texts = [], []
    for part in parts:
        if isinstance(part, str):
            piece = encode(part) if part else []
            if mask in piece:
                raise UserError(f"the text holds the model's mask token {mask_text or mask!r}; "
                                f"mark holes with {KNOWN}")
            ids += piece
            texts.append(part)
        else:
            n = default_len if part is None else part
            holes.append((len(ids), len(ids) + n))
            ids += [mask] * n
    return Filling(ids, holes, texts)


def for_model(lm, parts: list[str | int | None], default_len: int) -> Filling:
    """`tokenize` with a loaded model's tokenizer (raw text, no special tokens added) and mask."""
    mask = lm.specials.mask
    if mask < 0:
        raise UserError(f"{lm.path.name} cannot fill holes: it resamples whole canvases after the text")
    return tokenize(parts, lambda text: lm.encode(text, chat=False), mask=mask, default_len=default_len,
                    mask_text=lm.tokenizer.convert_ids_to_tokens(mask))


def cut(tokens: list[int], stops: set[int], trim: bool) -> list[int]:
    """A hole's tokens as reported: up to its first end token when trimming, else all of them."""
    if not trim:
        return tokens
    ends = [i for i, t in enumerate(tokens) if t in stops]
    return tokens[:ends[0]] if ends else tokens


def completed(filling: Filling, fills: list[str]) -> str:
    """The template's text with each hole replaced by its fill."""
    out = [filling.texts[0]]
    for fill, text in zip(fills, filling.texts[1:]):
        out += [fill, text]
    return "".join(out)
