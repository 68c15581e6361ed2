"""Fitting a live frame to the terminal. The consoles soft-wrap (cli/terminal.py): rich's Live
would leave long lines to the terminal and lose count of the lines it drew, and it crops a frame
taller than the screen from the top (the answer's start, then a red '...'). So a frame's texts
wrap themselves, and the body is cut to the lines that fit: the status line always in view, and
the front of the canvas."""

from __future__ import annotations

from rich.console import Console, Group
from rich.text import Text


def wrapping(text: Text) -> Text:
    """`text`, wrapped by rich at the console's width even on a soft-wrapping console."""
    text.no_wrap, text.overflow = False, "fold"
    return text


def fit_frame(console: Console, header: Text, body: Text, footer: Text, focus: int | None = None) -> Group:
    """Group(header, body, footer) in at most console.height - 1 lines (rich's own limit before it
    crops; a terminal under 4 lines still gets one line of each). The body's last lines are shown,
    unless they leave out `focus` (a character offset in `body`, the front): then the lines from a
    third of a screen above it."""
    width = console.width
    limit = max(3, console.height - 1)
    bottom = footer.wrap(console, width, overflow="fold")
    if len(bottom) > limit - 2:
        footer = Text("\n").join(bottom[:limit - 2])
    top = header.wrap(console, width, overflow="fold")
    room = limit - min(len(bottom), limit - 2)
    if len(top) > room - 1:                                       # the header gives way to the body first
        header = Text("\n").join(top[:room - 1])
    room -= min(len(top), room - 1)
    lines = body.wrap(console, width, overflow="fold")
    if len(lines) > room:
        first = len(lines) - room
        if focus is not None:
            first = min(first, max(0, line_of(console, body, len(lines), focus) - room // 3))
        body = Text("\n").join(lines[first:first + room])
    return Group(wrapping(header), wrapping(body), wrapping(footer))


def line_of(console: Console, body: Text, lines: int, focus: int) -> int:
    """The wrapped line (of `lines`) of `body` that holds character `focus`, found by wrapping the
    shorter side of it alone (from the end it can be one line off: the third of a screen shown
    above the focus absorbs that)."""
    before, after = body.plain[:focus], body.plain[focus:]
    if len(before) <= len(after):
        return len(Text(before).wrap(console, console.width, overflow="fold")) - 1
    return lines - len(Text(after).wrap(console, console.width, overflow="fold"))
