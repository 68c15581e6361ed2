"""The terminal side of every command: the two consoles (stdout for results, stderr for the rest),
rows for people, the live canvas, and keeping typed keys out of a spinner or live view."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console

# No markup parsing (user text such as a path with "[/x]" is printed as it is: styles are passed
# as arguments) and soft wrapping: a message stays one line in a pipe or file, not cut at 80 columns.
err_console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)
out_console = Console(highlight=False, markup=False, soft_wrap=True)


def live_view(lm, prompt_ids: list[int], cfg, header: str, constrained: bool = False):
    """The live canvas of one answer on stderr, shaped like the run (canvas.geometry); constrained:
    structured output (its frontier drawn apart)."""
    from fastdllm.decode.canvas import geometry
    from fastdllm.terminal.view import LiveCanvas

    width, offset = geometry(len(prompt_ids), cfg, lm.model.attention.causal)
    return LiveCanvas(err_console, lm.tokenizer, header, width, cfg.block_len, lm.specials.stops, offset=offset,
                      constrained=constrained)


def print_columns(rows: list[tuple[str, ...]], header: tuple[str, ...] | None = None) -> None:
    """Rows for people on stdout: a rich table on a terminal (long cells folded); in a pipe or a
    file whole lines, columns padded with two spaces and the last one neither cut nor padded."""
    if out_console.is_terminal:
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_header=header is not None)
        for i, name in enumerate(header or [""] * len(rows[0])):
            table.add_column(name, overflow="fold", style="bold" if i == 0 and header is None else None)
        for row in rows:
            table.add_row(*row)
        out_console.print(table)
        return
    lines = ([header] if header else []) + rows
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        sys.stdout.write("  ".join([c.ljust(w) for c, w in zip(line, widths)] + [line[-1]]) + "\n")


def is_terminal(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


@contextmanager
def keys_not_echoed():
    """While a spinner or the live view owns the terminal, typed keys are not echoed into it (they
    stay queued for whoever reads stdin next); the terminal's settings are restored afterwards."""
    try:
        import termios

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd) if sys.stdin.isatty() else None
    except (ImportError, AttributeError, OSError, ValueError):   # no termios (Windows), no real stdin
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO                                     # lflags
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
