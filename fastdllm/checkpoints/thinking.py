"""A chat template's thought channel (Gemma-4: `<|channel>thought\n...<channel|>`): the model's
thinking, written before its answer when the template's thinking is on. It is not the answer: the
text fastdllm shows, returns, serves and scores leaves it out (the ids keep it). A thought still
open when the canvas ends hides the rest: it is thinking that never reached an answer."""

from __future__ import annotations

MARKERS = ("<|channel>", "<channel|>")      # Gemma-4's channel open and close tokens


def thought_markers(tokenizer) -> tuple[int, int] | None:
    """The (open, close) ids where the tokenizer has both channel tokens as special tokens, else None."""
    vocab, special = tokenizer.get_vocab(), set(getattr(tokenizer, "added_tokens_decoder", {}))
    ids = tuple(vocab.get(m) for m in MARKERS)
    return ids if all(i is not None and i in special for i in ids) else None


def without_thought(ids: list[int], markers: tuple[int, int] | None) -> list[int]:
    """ids minus every span from an open marker through its close marker (to the end if unclosed)."""
    if markers is None or markers[0] not in ids:
        return ids
    kept, inside = [], False
    for token in ids:
        if token == markers[0]:
            inside = True
        elif token == markers[1] and inside:
            inside = False
        elif not inside:
            kept.append(token)
    return kept
