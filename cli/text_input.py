"""Text a user gives a command (a prompt argument, a file, stdin), always as valid UTF-8: a prompt
silently changed would give a silently different answer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fastdllm.errors import UsageError, UserError

from .terminal import is_terminal


def utf8(data: bytes, source: str) -> str:
    """Prompt bytes as text; invalid UTF-8 is refused with the byte and its offset (never guessed:
    a prompt silently changed would give a silently different answer)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{source} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}") from None


def argument_text(text: str, source: str) -> str:
    """A command-line argument as the user's bytes meant it (Python smuggles undecodable bytes in as
    lone surrogates), checked as UTF-8."""
    return utf8(os.fsencode(text), source)


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt from -f FILE, stdin or the argument; all three must be valid UTF-8 (one rule)."""
    if file is not None:
        try:
            data = file.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read prompt file {file}: {e}") from None
        return utf8(data, f"prompt file {file}")
    if prompt == "-" or (prompt is None and not is_terminal(sys.stdin)):
        stream = getattr(sys.stdin, "buffer", None)
        return utf8(stream.read(), "the prompt on stdin") if stream else sys.stdin.read()
    if prompt is None:
        raise UsageError("no prompt: give it as an argument, with -f FILE, or on stdin")
    return argument_text(prompt, "the prompt argument")


def read_text(path: Path, flag: str) -> str:
    if str(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        return utf8(stream.read(), f"{flag} on stdin") if stream else sys.stdin.read()
    try:
        return utf8(path.read_bytes(), f"{flag} {path}")
    except OSError as e:
        raise UserError(f"{flag}: cannot read {path}: {e.strerror or e}") from None
