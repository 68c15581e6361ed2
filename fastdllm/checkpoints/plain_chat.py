"""A conversation for a model that ships no chat template: a plain 'User: ... / Assistant:'
transcript, and the answer cut where the model starts the next 'User:' line (nothing else marks the
end of its turn). The chat REPL and serve's chat endpoint both use it."""

from __future__ import annotations


def plain_transcript(system: str | None, history: list[dict], message: str) -> str:
    """For a model without a chat template: a plain 'User: ... / Assistant:' transcript."""
    lines = [system, ""] if system else []
    for m in history + [{"role": "user", "content": message}]:
        lines.append(f"{m['role'].capitalize()}: {m['content']}")
    return "\n".join(lines) + "\nAssistant:"


def cut_plain_answer(text: str) -> str:
    """Without a template nothing marks the end of a turn: the answer stops where a 'User:' line starts."""
    return text.split("\nUser:")[0].strip()
