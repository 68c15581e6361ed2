"""The error and exit-code policy: a user's mistake is one line on stderr and exit code 1 or 2,
Ctrl+C is 130, and a traceback only with --debug (FASTDLLM_DEBUG)."""

from __future__ import annotations

import os

import typer
from rich.text import Text

from fastdllm.errors import UserError

from .options import with_options
from .terminal import err_console

DEBUG = {"on": bool(os.environ.get("FASTDLLM_DEBUG"))}

DEBUG_FLAG = {"debug": (bool, typer.Option("--debug", help="Show Python tracebacks."))}


def user_errors(func):
    """One line on stderr and an exit code for user mistakes; 130 on Ctrl+C; tracebacks with --debug
    (accepted after the subcommand as well as before it)."""
    def wrapper(*args, debug: bool | None = None, **kwargs):
        if debug:
            DEBUG["on"] = True
        try:
            return func(*args, **kwargs)
        except UserError as e:
            if DEBUG["on"]:
                raise
            err_console.print(Text("error: ", style="bold red") + Text(str(e)))
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            if DEBUG["on"]:
                raise
            err_console.print("interrupted", style="yellow")
            raise typer.Exit(130) from None

    return with_options(func, wrapper, DEBUG_FLAG)
