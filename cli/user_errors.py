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

# the modules of each optional extra (pyproject.toml): a command that meets one missing names its extra
EXTRAS = {"lm_eval": "eval", "datasets": "eval", "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve",
          "matplotlib": "plot", "llguidance": "structured", "bitsandbytes": "quant", "gguf": "gguf"}


def needs_extra(module: str, command: str) -> str | None:
    """The one line for a module of an optional extra that is not installed, else None (a bug)."""
    module = module.partition(".")[0]
    extra = EXTRAS.get(module)
    return extra and f"fastdllm {command} needs {module}, from the `{extra}` extra: pip install 'fastdllm[{extra}]'"


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
        except ModuleNotFoundError as e:
            line = needs_extra(e.name or "", func.__name__.rstrip("_"))
            if line is None or DEBUG["on"]:
                raise
            err_console.print(Text("error: ", style="bold red") + Text(line))
            raise typer.Exit(1) from None

    return with_options(func, wrapper, DEBUG_FLAG)
