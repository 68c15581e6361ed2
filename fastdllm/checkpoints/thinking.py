"""A chat template's thought span: Gemma-4's `<|channel>thought ... <channel|>`, Qwen3's (SDAR,
TraDo) `<think> ... </think>`. It is the model's thinking, written before its answer; it is not
the answer: the text fastdllm shows, returns, serves and scores leaves it out (the ids keep it).

`--think` switches the template's thinking on. Where that changes nothing in the prompt (Qwen3's
template: thinking is on by default and left to the model), the answer starts inside an opened
thought, `<think>\\n`, as TraDo-8B-Thinking's authors prompt it (`start_with_think`)."""

from __future__ import annotations

MARKER_PAIRS = (("<|channel>", "<channel|>"), ("<think>", "</think>"))   # (open, close), single tokens


def thought_markers(tokenizer) -> tuple[int, int] | None:
    """The (open, close) ids of the first marker pair the tokenizer has as added tokens, else None."""
    added = {token.content: i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    for pair in MARKER_PAIRS:               # (the added tokens alone: the whole vocabulary is 150k entries)
        ids = tuple(added.get(m) for m in pair)
        if all(i is not None for i in ids):
            return ids
    return None


def without_thought(ids: list[int], markers: tuple[int, int] | None) -> list[int]:
    """ids minus every thought: each span from an open marker through its close (to the end if
    unclosed), and everything before a close that has no open (the prompt opened that thought)."""
    if markers is None or not set(markers) & set(ids):
        return ids
    open_id, close_id = markers
    kept, inside = [], False
    for token in ids:
        if token == open_id:
            inside = True
        elif token == close_id:
            kept = kept if inside else []          # a close without an open: all before it was thought
            inside = False
        elif not inside:
            kept.append(token)
    return kept


def thought_prefill(markers: tuple[int, int] | None, tokenizer) -> str:
    """The text that opens a thought at the start of the answer ('' without markers)."""
    return "" if markers is None else tokenizer.convert_ids_to_tokens(markers[0]) + "\n"
